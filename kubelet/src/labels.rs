//! Docker labels and names that tie a container to its pod and its node.
//!
//! Every container the kubelet creates carries these labels, so that a restarted kubelet
//! adopts what is running, and several kubelets (different node names) share one Docker
//! engine without seeing each other's containers: every query filters on [`NODE`].

use std::collections::HashMap;

pub const NODE: &str = "minik8s.io/node";
pub const POD_UID: &str = "io.kubernetes.pod.uid";
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const POD_NAME: &str = "io.kubernetes.pod.name";
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
pub const RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
/// `init`, `app`, `ephemeral` or `sandbox`.
pub const CONTAINER_KIND: &str = "minik8s.io/container-kind";
/// On the sandbox (pause) container: the pod IP it was given.
pub const POD_IP: &str = "minik8s.io/pod-ip";
/// On the sandbox: the grace period to use when the pod is killed.
pub const GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";

/// The container name the pause container has in labels (as in dockershim).
pub const SANDBOX_NAME: &str = "POD";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Sandbox,
    Init,
    App,
    /// Added by `kubectl debug` (`spec.ephemeralContainers`): started once, never restarted.
    Ephemeral,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Sandbox => "sandbox",
            Kind::Init => "init",
            Kind::App => "app",
            Kind::Ephemeral => "ephemeral",
        }
    }
    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "sandbox" => Some(Kind::Sandbox),
            "init" => Some(Kind::Init),
            "app" => Some(Kind::App),
            "ephemeral" => Some(Kind::Ephemeral),
            _ => None,
        }
    }
}

/// Identity of the pod a container belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    pub uid: String,
    pub namespace: String,
    pub name: String,
}

/// The labels of one container.
pub fn container_labels(
    node: &str,
    pod: &PodRef,
    container: &str,
    kind: Kind,
    restart_count: i32,
) -> HashMap<String, String> {
    HashMap::from([
        (NODE.to_string(), node.to_string()),
        (POD_UID.to_string(), pod.uid.clone()),
        (POD_NAMESPACE.to_string(), pod.namespace.clone()),
        (POD_NAME.to_string(), pod.name.clone()),
        (CONTAINER_NAME.to_string(), container.to_string()),
        (CONTAINER_KIND.to_string(), kind.as_str().to_string()),
        (RESTART_COUNT.to_string(), restart_count.to_string()),
    ])
}

/// Docker's name for a container, as dockershim named them:
/// `k8s_<container>_<pod>_<namespace>_<uid>_<attempt>`.
pub fn docker_name(pod: &PodRef, container: &str, restart_count: i32) -> String {
    format!("k8s_{container}_{}_{}_{}_{restart_count}", pod.name, pod.namespace, pod.uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_carry_pod_and_node() {
        let p = PodRef { uid: "u1".into(), namespace: "ns".into(), name: "p".into() };
        let l = container_labels("node-a", &p, "web", Kind::App, 3);
        assert_eq!(l[NODE], "node-a");
        assert_eq!(l[POD_UID], "u1");
        assert_eq!(l[RESTART_COUNT], "3");
        assert_eq!(Kind::parse(&l[CONTAINER_KIND]), Some(Kind::App));
        assert_eq!(docker_name(&p, "web", 3), "k8s_web_p_ns_u1_3");
    }
}
