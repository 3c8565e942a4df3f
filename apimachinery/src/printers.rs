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

/// A Node's roles as `kubectl get nodes` and `describe node` print them: the `<role>` of
/// every `node-role.kubernetes.io/<role>` label and the value of `kubernetes.io/role`, sorted,
/// or `<none>` (`findNodeRoles`).
pub fn node_roles(node: &Value) -> String {
    let mut roles: Vec<&str> = node
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| match k.strip_prefix("node-role.kubernetes.io/") {
            Some(role) => Some(role),
            None if k == "kubernetes.io/role" => v.as_str(),
            None => None,
        })
        .filter(|r| !r.is_empty())
        .collect();
    roles.sort_unstable();
    roles.dedup();
    if roles.is_empty() {
        "<none>".into()
    } else {
        roles.join(",")
    }
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

    #[test]
    fn node_roles_come_from_both_label_forms() {
        let node = json!({"metadata": {"labels": {
            "node-role.kubernetes.io/worker": "", "node-role.kubernetes.io/control-plane": "",
            "kubernetes.io/role": "worker", "other": "x"}}});
        assert_eq!(node_roles(&node), "control-plane,worker");
        assert_eq!(node_roles(&json!({"metadata": {}})), "<none>");
    }
}
