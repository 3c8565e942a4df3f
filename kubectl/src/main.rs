//! `kubectl`: the MiniK8s command line, a drop-in for the everyday kubectl. A `kube` client
//! reading the standard kubeconfig; one module per command under `cmd/`, pure formatting in
//! `print/`, client-side apply's three-way merge in `merge.rs`.

mod client;
mod cmd;
mod error;
mod kustomize;
mod manifest;
mod merge;
mod print;
mod resources;

use clap::{CommandFactory, Parser, Subcommand};

use client::{Ctx, GlobalOpts};
use error::{KubectlError, Result};

/// kubectl controls the Kubernetes cluster manager.
#[derive(Debug, Parser)]
#[command(name = "kubectl", disable_version_flag = true)]
struct Cli {
    #[command(flatten)]
    global: GlobalOpts,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Display one or many resources.
    Get(cmd::get::Args),
    /// Apply a configuration to a resource by file name or stdin.
    Apply(cmd::apply::Args),
    /// Create a resource from a file or from stdin.
    Create(cmd::create::CreateArgs),
    /// Replace a resource by file name or stdin.
    Replace(cmd::create::ReplaceArgs),
    /// Delete resources by file names, stdin, resources and names, or by resources and label selector.
    Delete(cmd::delete::Args),
    /// Show details of a specific resource or group of resources.
    Describe(cmd::describe::Args),
    /// Print the logs for a container in a pod.
    Logs(cmd::logs::Args),
    /// Execute a command in a container.
    Exec(cmd::exec::Args),
    /// Attach to a running container.
    Attach(cmd::exec::AttachArgs),
    /// Forward one or more local ports to a pod.
    PortForward(cmd::port_forward::Args),
    /// Set a new size for a deployment, replica set, replication controller, or stateful set.
    Scale(cmd::scale::Args),
    /// Auto-scale a deployment, replica set, stateful set, or replication controller.
    Autoscale(cmd::autoscale::Args),
    /// Update the labels on a resource.
    Label(cmd::label::Args),
    /// Update the annotations on a resource.
    Annotate(cmd::label::Args),
    /// Update fields of a resource using strategic merge patch, a JSON merge patch, or a JSON patch.
    Patch(cmd::patch::Args),
    /// Manage the rollout of a resource.
    Rollout(cmd::rollout::Args),
    /// Mark node as unschedulable.
    Cordon(cmd::node::Args),
    /// Mark node as schedulable.
    Uncordon(cmd::node::Args),
    /// Drain node in preparation for maintenance.
    Drain(cmd::node::DrainArgs),
    /// Experimental: Wait for a specific condition on one or many resources.
    Wait(cmd::wait::Args),
    /// Display resource (CPU/memory) usage.
    Top(cmd::top::Args),
    /// Edit a resource on the server.
    Edit(cmd::edit::Args),
    /// Get documentation for a resource.
    Explain(cmd::explain::Args),
    /// Print the supported API resources on the server.
    ApiResources(cmd::api_resources::Args),
    /// Print the client and server version information.
    Version(cmd::version::Args),
    /// Display cluster information.
    ClusterInfo,
    /// Modify kubeconfig files.
    Config(cmd::config::Args),
    /// Build a kustomization target from a directory.
    Kustomize {
        /// The kustomization directory (default: the current one).
        #[arg(default_value = ".")]
        dir: String,
    },
    /// Output shell completion code for the specified shell (bash, zsh, fish).
    Completion {
        /// bash, zsh, fish, powershell or elvish
        shell: clap_complete::Shell,
    },
}

async fn run(cli: Cli) -> Result<()> {
    let g = &cli.global;
    match &cli.cmd {
        Cmd::Config(a) => return cmd::config::run(g, a),
        Cmd::Completion { shell } => {
            clap_complete::generate(*shell, &mut Cli::command(), "kubectl", &mut std::io::stdout());
            return Ok(());
        }
        Cmd::Version(a) if a.client => return cmd::version::run(None, a).await,
        Cmd::Kustomize { dir } => {
            let objs = kustomize::build(&kustomize::Disk, std::path::Path::new(dir))?;
            let docs: Vec<String> = objs.iter().map(print::to_yaml).collect();
            print!("{}", docs.join("---\n"));
            return Ok(());
        }
        _ => {}
    }
    let ctx = Ctx::connect(g).await?;
    match &cli.cmd {
        Cmd::Get(a) => cmd::get::run(&ctx, a).await,
        Cmd::Apply(a) => cmd::apply::run(&ctx, a).await,
        Cmd::Create(a) => cmd::create::create(&ctx, a).await,
        Cmd::Replace(a) => cmd::create::replace(&ctx, a).await,
        Cmd::Delete(a) => cmd::delete::run(&ctx, a).await,
        Cmd::Describe(a) => cmd::describe::run(&ctx, a).await,
        Cmd::Logs(a) => cmd::logs::run(&ctx, a).await,
        Cmd::Exec(a) => cmd::exec::run(&ctx, a).await,
        Cmd::Attach(a) => cmd::exec::attach(&ctx, a).await,
        Cmd::PortForward(a) => cmd::port_forward::run(&ctx, a).await,
        Cmd::Scale(a) => cmd::scale::run(&ctx, a).await,
        Cmd::Autoscale(a) => cmd::autoscale::run(&ctx, a).await,
        Cmd::Label(a) => cmd::label::run(&ctx, a, "labels", "labeled").await,
        Cmd::Annotate(a) => cmd::label::run(&ctx, a, "annotations", "annotated").await,
        Cmd::Patch(a) => cmd::patch::run(&ctx, a).await,
        Cmd::Rollout(a) => cmd::rollout::run(&ctx, a).await,
        Cmd::Cordon(a) => cmd::node::cordon(&ctx, a, true).await,
        Cmd::Uncordon(a) => cmd::node::cordon(&ctx, a, false).await,
        Cmd::Drain(a) => cmd::node::drain(&ctx, a).await,
        Cmd::Edit(a) => cmd::edit::run(&ctx, a).await,
        Cmd::Wait(a) => cmd::wait::run(&ctx, a).await,
        Cmd::Top(a) => cmd::top::run(&ctx, a).await,
        Cmd::Explain(a) => cmd::explain::run(&ctx, a).await,
        Cmd::ApiResources(a) => cmd::api_resources::run(&ctx, a).await,
        Cmd::Version(a) => cmd::version::run(Some(&ctx), a).await,
        Cmd::ClusterInfo => cmd::version::cluster_info(&ctx).await,
        Cmd::Config(_) | Cmd::Completion { .. } | Cmd::Kustomize { .. } => Ok(()),
    }
}

fn main() {
    if let Some(sub) = Cli::command().try_get_matches().ok().and_then(|m| m.subcommand_name().map(str::to_string)) {
        client::set_command(&sub);
    }
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 1 } else { 0 };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            std::process::exit(1);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => {}
        Err(KubectlError::Reported) => std::process::exit(1),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn kubectl_style_flags_parse() {
        let c = Cli::try_parse_from(["kubectl", "-n", "x", "get", "po", "-o", "wide", "-A", "-l", "a=b"]).unwrap();
        assert_eq!(c.global.namespace.as_deref(), Some("x"));
        let c = Cli::try_parse_from(["kubectl", "delete", "po", "a", "--wait=false", "--grace-period=-1"]).unwrap();
        assert!(matches!(c.cmd, Cmd::Delete(ref d) if !d.wait && d.grace_period == -1));
        assert!(
            Cli::try_parse_from(["kubectl", "apply", "-f", "x.yaml", "--dry-run=server", "--validate=false"]).is_ok()
        );
    }
}
