//! One module per kubectl command; each has clap `Args` and an async `run`.

pub mod api_resources;
pub mod apply;
pub mod autoscale;
pub mod config;
pub mod create;
pub mod delete;
pub mod describe;
pub mod describe_more;
pub mod edit;
pub mod exec;
pub mod explain;
pub mod generate;
pub mod get;
pub mod label;
pub mod logs;
pub mod node;
pub mod patch;
pub mod port_forward;
pub mod rollout;
pub mod scale;
pub mod top;
pub mod version;
pub mod wait;

use crate::client::Ctx;
use crate::error::{KubectlError, Result};
use crate::resources::ApiRes;

/// `TYPE NAME…` or `TYPE/NAME…` resolved to (resource, name) pairs.
pub async fn resolve_targets(ctx: &Ctx, args: &[String]) -> Result<Vec<(ApiRes, String)>> {
    let mut out = Vec::new();
    for r in get::parse_args(args)? {
        let res = ctx.resolve(&r.type_arg).await?;
        if r.names.is_empty() {
            return Err(KubectlError::msg("resource(s) were provided, but no name was specified"));
        }
        for n in r.names {
            out.push((res.clone(), n));
        }
    }
    Ok(out)
}

/// The namespace to address `res` in: the request's for namespaced resources.
pub fn ns_for<'a>(ctx: &'a Ctx, res: &ApiRes) -> Option<&'a str> {
    res.namespaced.then_some(ctx.namespace.as_str())
}
