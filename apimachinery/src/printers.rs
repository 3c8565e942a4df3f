//! Small renderings that the apiserver's tables and kubectl's describe print alike.

use serde_json::Value;

/// A PV's or PVC's access modes as kubectl prints them: `RWO,ROX` (`GetAccessModesAsString`).
pub fn access_modes(modes: Option<&Value>) -> String {
    modes
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|m| match m {
            "ReadWriteOnce" => "RWO",
            "ReadOnlyMany" => "ROX",
            "ReadWriteMany" => "RWX",
            "ReadWriteOncePod" => "RWOP",
            other => other,
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn abbreviates_known_modes() {
        assert_eq!(access_modes(Some(&json!(["ReadWriteOnce", "ReadOnlyMany", "Custom"]))), "RWO,ROX,Custom");
        assert_eq!(access_modes(None), "");
    }
}
