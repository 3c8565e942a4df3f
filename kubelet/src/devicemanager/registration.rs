//! The kubelet's `Registration` service on `<dir>/kubelet.sock`: a plugin that names a
//! supported API version, an extended resource and a socket file in the same directory is
//! accepted, and the manager starts following it; anything else is refused with
//! Kubernetes' messages, and the plugin is expected to exit.

use std::sync::Arc;

use deviceplugin::v1beta1::registration_server::{Registration, RegistrationServer};
use deviceplugin::v1beta1::{Empty, RegisterRequest};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use super::DeviceManager;

const SUPPORTED: &[&str] = &[deviceplugin::VERSION];

/// Why a registration is refused, if it is.
pub fn validate(r: &RegisterRequest) -> Result<(), String> {
    if !SUPPORTED.contains(&r.version.as_str()) {
        return Err(format!(
            "requested API version {:?} is not supported by kubelet. Supported versions are {SUPPORTED:?}",
            r.version
        ));
    }
    if !apimachinery::resources::is_extended(&r.resource_name) {
        return Err(format!("the ResourceName {:?} is invalid", r.resource_name));
    }
    if r.endpoint.is_empty() || r.endpoint.contains('/') || r.endpoint == ".." || r.endpoint == "." {
        return Err(format!("the endpoint {:?} is not a socket file name in the device-plugin directory", r.endpoint));
    }
    Ok(())
}

struct Registrar {
    dm: Arc<DeviceManager>,
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn register(&self, req: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let r = req.into_inner();
        if let Err(msg) = validate(&r) {
            tracing::warn!(resource = %r.resource_name, endpoint = %r.endpoint, %msg, "refused a device plugin");
            return Err(Status::invalid_argument(msg));
        }
        tracing::info!(resource = %r.resource_name, endpoint = %r.endpoint, "device plugin registered");
        let options = r.options.unwrap_or_default();
        tokio::spawn(self.dm.clone().follow(r.resource_name, r.endpoint, options));
        Ok(Response::new(Empty {}))
    }
}

/// Serve the registration service on `incoming` in the background.
pub fn serve(dm: Arc<DeviceManager>, incoming: UnixListenerStream) {
    let service = RegistrationServer::new(Registrar { dm });
    tokio::spawn(async move {
        if let Err(e) = tonic::transport::Server::builder().add_service(service).serve_with_incoming(incoming).await {
            tracing::error!(error = %e, "the device plugin registration server stopped");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(version: &str, resource: &str, endpoint: &str) -> RegisterRequest {
        RegisterRequest {
            version: version.into(),
            resource_name: resource.into(),
            endpoint: endpoint.into(),
            options: None,
        }
    }

    #[test]
    fn only_extended_resources_on_a_local_socket() {
        assert!(validate(&req("v1beta1", "example.com/widget", "w.sock")).is_ok());
        assert_eq!(
            validate(&req("v1alpha", "example.com/widget", "w.sock")).unwrap_err(),
            "requested API version \"v1alpha\" is not supported by kubelet. Supported versions are [\"v1beta1\"]"
        );
        assert_eq!(validate(&req("v1beta1", "cpu", "w.sock")).unwrap_err(), "the ResourceName \"cpu\" is invalid");
        assert!(validate(&req("v1beta1", "kubernetes.io/x", "w.sock")).is_err());
        assert!(validate(&req("v1beta1", "example.com/widget", "../w.sock")).is_err());
        assert!(validate(&req("v1beta1", "example.com/widget", "")).is_err());
    }
}
