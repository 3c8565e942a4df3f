//! `kubectl version` and `kubectl cluster-info`.

use serde_json::Value;

use crate::client::Ctx;
use crate::error::Result;

/// The client version we claim (the Kubernetes API level we speak).
pub const CLIENT_GIT_VERSION: &str = "v1.37.0-minik8s";

/// Print the client and server version information.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// If true, shows client version only (no server required).
    #[arg(long)]
    pub client: bool,
    /// One of 'yaml' or 'json'.
    #[arg(short = 'o', long)]
    pub output: Option<String>,
}

/// The human form of `kubectl version`. Pure.
pub fn render(server: Option<&Value>) -> String {
    let mut s = format!("Client Version: {CLIENT_GIT_VERSION}\n");
    if let Some(v) = server {
        s.push_str(&format!("Server Version: {}\n", v.get("gitVersion").and_then(Value::as_str).unwrap_or("unknown")));
    }
    s
}

pub async fn run(ctx: Option<&Ctx>, a: &Args) -> Result<()> {
    let server = match (a.client, ctx) {
        (false, Some(ctx)) => Some(ctx.get("/version").await?),
        _ => None,
    };
    match a.output.as_deref() {
        Some("json") | Some("yaml") => {
            let mut doc =
                serde_json::json!({"clientVersion": {"gitVersion": CLIENT_GIT_VERSION, "major": "1", "minor": "37"}});
            if let Some(s) = server {
                doc["serverVersion"] = s;
            }
            if a.output.as_deref() == Some("json") {
                print!("{}", crate::print::to_json(&doc));
            } else {
                print!("{}", crate::print::to_yaml(&doc));
            }
        }
        _ => print!("{}", render(server.as_ref())),
    }
    Ok(())
}

/// `kubectl cluster-info`.
pub async fn cluster_info(ctx: &Ctx) -> Result<()> {
    ctx.get("/version").await?;
    let url = ctx.server.trim_end_matches('/');
    println!("Kubernetes control plane is running at {url}");
    println!("\nTo further debug and diagnose cluster problems, use 'kubectl cluster-info dump'.");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders() {
        let v = serde_json::json!({"gitVersion": "v1.33.0"});
        assert_eq!(render(Some(&v)), format!("Client Version: {CLIENT_GIT_VERSION}\nServer Version: v1.33.0\n"));
    }
}
