//! `kubectl api-resources`: the server's resource types from discovery, as a table.

use crate::client::Ctx;
use crate::error::Result;
use crate::print::table::align;
use crate::resources::ApiRes;

/// Print the supported API resources on the server.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Output format: wide or name.
    #[arg(short = 'o', long)]
    pub output: Option<String>,
    /// If false, non-namespaced resources will be returned.
    #[arg(long, action = clap::ArgAction::Set)]
    pub namespaced: Option<bool>,
    /// Limit to resources in the specified API group.
    #[arg(long)]
    pub api_group: Option<String>,
    /// When using the default output format, don't print headers.
    #[arg(long)]
    pub no_headers: bool,
}

/// The table rows. Pure.
pub fn rows(res: &[ApiRes], a: &Args) -> Vec<Vec<String>> {
    let mut list: Vec<&ApiRes> = res
        .iter()
        .filter(|r| a.namespaced.is_none_or(|n| r.namespaced == n))
        .filter(|r| a.api_group.as_ref().is_none_or(|g| r.group == *g))
        .collect();
    list.sort_by(|x, y| (x.group.as_str(), x.plural.as_str()).cmp(&(y.group.as_str(), y.plural.as_str())));
    let wide = a.output.as_deref() == Some("wide");
    let mut out = Vec::new();
    if a.output.as_deref() == Some("name") {
        return list.iter().map(|r| vec![r.plural_group()]).collect();
    }
    if !a.no_headers {
        let mut h: Vec<String> =
            ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"].iter().map(|s| s.to_string()).collect();
        if wide {
            h.push("VERBS".into());
            h.push("CATEGORIES".into());
        }
        out.push(h);
    }
    for r in list {
        let mut row =
            vec![r.plural.clone(), r.short_names.join(","), r.api_version(), r.namespaced.to_string(), r.kind.clone()];
        if wide {
            row.push(format!("[{}]", r.verbs.join(" ")));
            row.push(r.categories.join(","));
        }
        out.push(row);
    }
    out
}

pub async fn run(ctx: &Ctx, a: &Args) -> Result<()> {
    let res = ctx.discovery().await?;
    print!("{}", align(&rows(res, a)));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorted_core_first() {
        let a = Args { output: None, namespaced: None, api_group: None, no_headers: false };
        let r = rows(&crate::resources::well_known(), &a);
        assert_eq!(r[0], vec!["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]);
        assert_eq!(r[1][0], "configmaps");
        assert!(r.iter().any(|x| x[0] == "deployments" && x[1] == "deploy" && x[2] == "apps/v1"));
    }
}
