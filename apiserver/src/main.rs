//! The `apiserver` binary.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

/// The `kubernetes` Service's endpoint address when --advertise-address is not given (as
/// kube-apiserver: the bind address, or the host's primary one for an unspecified bind).
fn endpoint_ip_for_bind(bind: &str) -> Option<std::net::IpAddr> {
    let ip: std::net::IpAddr = bind.parse().ok()?;
    if ip.is_unspecified() {
        common::default_host_ip()
    } else {
        Some(ip).filter(|ip| !ip.is_loopback())
    }
}

#[derive(Parser, Debug)]
#[command(name = "apiserver", about = "MiniK8s apiserver: the Kubernetes REST API", version)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    bind_address: String,
    /// Accept bootstrap tokens (`bootstrap.kubernetes.io/token` Secrets in kube-system) as
    /// credentials: `system:bootstrap:<id>` in `system:bootstrappers`.
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    enable_bootstrap_token_auth: bool,
    /// How the `kubernetes` Service's endpoints are kept: `lease` (each apiserver renews a
    /// Lease in kube-system and the endpoints list every apiserver whose lease is alive, so
    /// several apiservers of one store are all there) or `none` (left as they are).
    #[arg(long, default_value = "lease", value_parser = ["lease", "none"])]
    endpoint_reconciler_type: String,
    /// The IP address this apiserver is reached at by the cluster: the `kubernetes`
    /// Service's endpoints (how pods reach the API) and discovery's server address. Not a
    /// loopback address: pods cannot reach the host's. Default: with --bind-address 0.0.0.0
    /// the host's primary address, with another non-loopback --bind-address that one, with a
    /// loopback one (the default) none, and the Service has no endpoints.
    #[arg(long)]
    advertise_address: Option<std::net::IpAddr>,
    /// Port to serve plain HTTP on (0: none). Without --tls-cert-file it defaults to 6443;
    /// with it there is no plain-HTTP listener unless this is given.
    #[arg(long)]
    port: Option<u16>,
    /// Port to serve HTTPS on, with --tls-cert-file.
    #[arg(long, default_value_t = 6443)]
    secure_port: u16,
    /// File containing the default x509 certificate for HTTPS (the CA certificates after the
    /// server's, if any). Enables the secure port.
    #[arg(long)]
    tls_cert_file: Option<PathBuf>,
    /// File containing the default x509 private key matching --tls-cert-file.
    #[arg(long)]
    tls_private_key_file: Option<PathBuf>,
    /// If set, any request presenting a client certificate signed by one of the authorities in
    /// this file is authenticated with an identity corresponding to the CommonName of the
    /// client certificate (and its Organizations as groups).
    #[arg(long)]
    client_ca_file: Option<PathBuf>,
    /// Enables anonymous requests: requests no authenticator rejects are served as
    /// system:anonymous in system:unauthenticated, and the authorizer decides (RBAC lets
    /// them read health and version only). With AlwaysAllow they are limited to the health
    /// and version endpoints.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    anonymous_auth: bool,
    /// Client certificate (PEM) the apiserver presents to kubelets (logs, exec, port-forward,
    /// node proxy, stats).
    #[arg(long, requires = "kubelet_client_key")]
    kubelet_client_certificate: Option<PathBuf>,
    /// Key of --kubelet-client-certificate.
    #[arg(long, requires = "kubelet_client_certificate")]
    kubelet_client_key: Option<PathBuf>,
    /// CA that signed the kubelets' serving certificates; without it they are not verified.
    #[arg(long)]
    kubelet_certificate_authority: Option<PathBuf>,
    /// Directory of the embedded store (a SQLite file inside it).
    #[arg(long, default_value = "/var/lib/minik8s")]
    data_dir: PathBuf,
    /// etcd endpoints (comma-separated); selects the etcd backend instead of the embedded one.
    #[arg(long, value_delimiter = ',')]
    etcd_servers: Vec<String>,
    /// SSL Certificate Authority file used to secure etcd communication (`https://` servers).
    #[arg(long)]
    etcd_cafile: Option<PathBuf>,
    /// SSL certification file used to secure etcd communication.
    #[arg(long, requires = "etcd_keyfile")]
    etcd_certfile: Option<PathBuf>,
    /// SSL key file used to secure etcd communication.
    #[arg(long, requires = "etcd_certfile")]
    etcd_keyfile: Option<PathBuf>,
    /// CIDR Service cluster IPs are allocated from.
    #[arg(long, default_value = "10.96.0.0/12")]
    service_cluster_ip_range: String,
    /// Port range NodePorts are allocated from.
    #[arg(long, default_value = "30000-32767")]
    service_node_port_range: String,
    /// Bound on concurrent read-only requests (429 beyond it).
    #[arg(long, default_value_t = 400)]
    max_requests_inflight: usize,
    /// Bound on concurrent mutating requests (429 beyond it).
    #[arg(long, default_value_t = 200)]
    max_mutating_requests_inflight: usize,
    /// Events each resource's watch cache keeps at least for watchers resuming from an
    /// older resourceVersion (older ones catch up from storage first, then use the cache);
    /// a busy resource's cache grows to keep 75 s of its events (up to 102,400) and shrinks
    /// back when it quiets down. 0 keeps none; watchers still share the cache's single
    /// storage watch.
    #[arg(long, default_value_t = apiserver::watch::DEFAULT_CACHE_SIZE)]
    default_watch_cache_size: usize,
    /// How often storage history is compacted (Go duration, e.g. 5m, 30s; 0 disables).
    #[arg(long, default_value = "5m")]
    etcd_compaction_interval: String,
    /// How long Events are kept after they last happened (Go duration; 0 keeps them).
    #[arg(long, default_value = "1h")]
    event_ttl: String,
    /// Static token file (CSV: token,user,uid,"group1,group2"): requests authenticate with
    /// `Authorization: Bearer <token>` of a listed user (see --anonymous-auth for the others).
    #[arg(long)]
    token_auth_file: Option<PathBuf>,
    /// Ordered list of plug-ins that authorize requests (comma-separated): AlwaysAllow,
    /// AlwaysDeny, RBAC, Node. Members of system:masters are always allowed.
    #[arg(long, default_value = "AlwaysAllow")]
    authorization_mode: String,
    /// Port of an additional plain-HTTP listener that needs no authentication (0: none), as
    /// kube-apiserver's `--insecure-port` before 1.20: for the official kubectl on this host,
    /// which sends no token over plain HTTP. Keep it on a loopback address.
    #[arg(long, default_value_t = 0)]
    insecure_port: u16,
    /// Address of the `--insecure-port` listener.
    #[arg(long, default_value = "127.0.0.1")]
    insecure_bind_address: String,
    /// Private key (PKCS#8 PEM, ECDSA P-256) that signs ServiceAccount tokens; without it the
    /// TokenRequest API answers 404 and pods get no token volume.
    #[arg(long)]
    service_account_signing_key_file: Option<PathBuf>,
    /// Further keys (PEM) that verify ServiceAccount tokens, e.g. the public half of a
    /// previous signing key; repeatable.
    #[arg(long)]
    service_account_key_file: Vec<PathBuf>,
    /// The issuer (`iss`) of ServiceAccount tokens; repeatable: the first issues, all verify.
    #[arg(long, default_value = "https://kubernetes.default.svc.cluster.local")]
    service_account_issuer: Vec<String>,
    /// The JWKS URI the OIDC discovery document names (default: the issuer's /openid/v1/jwks).
    #[arg(long)]
    service_account_jwks_uri: Option<String>,
    /// The longest lifetime of a requested token (Go duration; 0: no maximum).
    #[arg(long, default_value = "0")]
    service_account_max_token_expiration: String,
    /// Audiences this apiserver accepts in tokens (comma-separated; default: the issuer).
    #[arg(long, value_delimiter = ',')]
    api_audiences: Vec<String>,
    /// How often a watch with allowWatchBookmarks gets a BOOKMARK (Go duration). Internal,
    /// for tests: kube-apiserver has no such flag and bookmarks about once a minute.
    #[arg(long, default_value = "1m", hide = true)]
    watch_bookmark_interval: String,
    /// Client certificate (PEM) presented to aggregated API servers (the APIServices that
    /// name a Service) when requests are proxied to them and their availability is checked.
    #[arg(long, requires = "proxy_client_key_file")]
    proxy_client_cert_file: Option<PathBuf>,
    /// Key of --proxy-client-cert-file.
    #[arg(long, requires = "proxy_client_cert_file")]
    proxy_client_key_file: Option<PathBuf>,
    /// How often every aggregated APIService's availability is checked again (Go duration).
    /// Internal, for tests: kube-aggregator resyncs every 30 s.
    #[arg(long, default_value = "30s", hide = true)]
    aggregator_resync_interval: String,
    /// Log level or tracing filter (error, warn, info, debug, trace, or e.g. "apiserver=debug").
    #[arg(short = 'v', long = "log-level", default_value = "info")]
    log_level: String,
}

/// The ServiceAccount token issuer of the `--service-account-*` flags, if a signing key is set.
fn service_account_issuer(args: &Args) -> anyhow::Result<Option<std::sync::Arc<apiserver::serviceaccount::Issuer>>> {
    let Some(signing) = &args.service_account_signing_key_file else {
        if !args.service_account_key_file.is_empty() {
            anyhow::bail!("--service-account-key-file needs --service-account-signing-key-file");
        }
        return Ok(None);
    };
    let keys = apiserver::serviceaccount::keys::Keys::load(signing, &args.service_account_key_file)?;
    let max = apiserver::parse_go_duration(&args.service_account_max_token_expiration)
        .map_err(|e| anyhow::anyhow!("invalid --service-account-max-token-expiration: {e}"))?;
    if !max.is_zero() && max.as_secs() < 3600 {
        anyhow::bail!("--service-account-max-token-expiration must be at least 1h");
    }
    let issuers: Vec<String> = args.service_account_issuer.iter().filter(|i| !i.is_empty()).cloned().collect();
    anyhow::ensure!(!issuers.is_empty(), "--service-account-issuer must not be empty");
    let audiences = args.api_audiences.iter().filter(|a| !a.is_empty()).cloned().collect();
    let max = (!max.is_zero()).then(|| max.as_secs() as i64);
    tracing::info!(?keys, issuer = issuers[0], "ServiceAccount token issuance enabled");
    Ok(Some(std::sync::Arc::new(apiserver::serviceaccount::Issuer::new(
        keys,
        issuers,
        audiences,
        max,
        args.service_account_jwks_uri.clone(),
    ))))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // `Targets` takes the same `level` / `target=level,...` lists as EnvFilter without its
    // span and field matchers, and without linking a regex engine into the apiserver.
    let filter: tracing_subscriber::filter::Targets =
        args.log_level.parse().with_context(|| format!("invalid --log-level {:?}", args.log_level))?;
    {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::util::SubscriberInitExt;
        tracing_subscriber::registry()
            .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
            .with(filter)
            .init();
    }

    let authorization_modes = apiserver::authz::parse_modes(&args.authorization_mode)
        .map_err(|e| anyhow::anyhow!("invalid --authorization-mode: {e}"))?;
    apiserver::kubeletclient::configure(
        args.kubelet_client_certificate.as_deref().zip(args.kubelet_client_key.as_deref()),
        args.kubelet_certificate_authority.as_deref(),
    )?;
    let tls = match (&args.tls_cert_file, &args.tls_private_key_file) {
        (Some(cert), Some(key)) => Some(common::tls::server_config(&common::tls::TlsFiles {
            cert,
            key,
            client_ca: args.client_ca_file.as_deref(),
        })?),
        (None, None) => None,
        _ => anyhow::bail!("--tls-cert-file and --tls-private-key-file must be given together"),
    };
    anyhow::ensure!(
        tls.is_some() || args.client_ca_file.is_none(),
        "--client-ca-file needs the secure port (--tls-cert-file and --tls-private-key-file)"
    );
    // Plain HTTP: 6443 by default without TLS, only on request with it.
    let plain_port = match (args.port, &tls) {
        (Some(p), _) => p,
        (None, None) => 6443,
        (None, Some(_)) => 0,
    };
    let served_port = if tls.is_some() { args.secure_port } else { plain_port };
    let authn = match &args.token_auth_file {
        Some(path) => {
            let auth = apiserver::authn::TokenAuthenticator::load(path)?;
            tracing::info!(path = %path.display(), users = auth.len(), "token authentication enabled");
            Some(std::sync::Arc::new(auth))
        }
        None => None,
    };
    let backend = if args.etcd_servers.iter().any(|s| !s.is_empty()) {
        let read =
            |flag: &str, p: &PathBuf| std::fs::read(p).with_context(|| format!("cannot read {flag} {}", p.display()));
        let tls = if args.etcd_cafile.is_some() || args.etcd_certfile.is_some() {
            Some(storage::etcd::EtcdTls {
                ca: args.etcd_cafile.as_ref().map(|p| read("--etcd-cafile", p)).transpose()?,
                identity: match (&args.etcd_certfile, &args.etcd_keyfile) {
                    (Some(c), Some(k)) => Some((read("--etcd-certfile", c)?, read("--etcd-keyfile", k)?)),
                    _ => None,
                },
            })
        } else {
            None
        };
        storage::Backend::Etcd { endpoints: args.etcd_servers.iter().filter(|s| !s.is_empty()).cloned().collect(), tls }
    } else {
        std::fs::create_dir_all(&args.data_dir)
            .with_context(|| format!("cannot create --data-dir {}", args.data_dir.display()))?;
        storage::Backend::Embedded { path: args.data_dir.join("minik8s.db") }
    };
    tracing::info!(?backend, "opening storage");
    let store = storage::open(&backend).await.context("opening storage")?;
    let interval = apiserver::parse_go_duration(&args.etcd_compaction_interval)
        .map_err(|e| anyhow::anyhow!("invalid --etcd-compaction-interval: {e}"))?;
    let _compactor = (!interval.is_zero()).then(|| storage::spawn_compactor(store.clone(), interval));

    if let Some(ip) = args.advertise_address {
        anyhow::ensure!(!ip.is_loopback() && !ip.is_unspecified(), "--advertise-address {ip}: pods cannot reach it");
    }
    let advertise = match (args.advertise_address, args.bind_address.as_str()) {
        (Some(ip), _) => std::net::SocketAddr::new(ip, served_port).to_string(),
        (None, "0.0.0.0" | "::") => format!("127.0.0.1:{served_port}"),
        (None, bind) => format!("{bind}:{served_port}"),
    };
    let watch_bookmark_interval = apiserver::parse_go_duration(&args.watch_bookmark_interval)
        .map_err(|e| anyhow::anyhow!("invalid --watch-bookmark-interval: {e}"))?;
    anyhow::ensure!(!watch_bookmark_interval.is_zero(), "--watch-bookmark-interval must be positive");
    let aggregator_resync = apiserver::parse_go_duration(&args.aggregator_resync_interval)
        .map_err(|e| anyhow::anyhow!("invalid --aggregator-resync-interval: {e}"))?;
    anyhow::ensure!(!aggregator_resync.is_zero(), "--aggregator-resync-interval must be positive");
    let opts = apiserver::Options {
        service_cluster_ip_range: args.service_cluster_ip_range.clone(),
        service_node_port_range: args.service_node_port_range.clone(),
        max_requests_inflight: args.max_requests_inflight,
        max_mutating_requests_inflight: args.max_mutating_requests_inflight,
        advertise_address: advertise,
        endpoint_ip: args.advertise_address.or_else(|| endpoint_ip_for_bind(&args.bind_address)),
        enable_bootstrap_token_auth: args.enable_bootstrap_token_auth,
        port: served_port,
        watch_bookmark_interval,
        watch_cache_size: args.default_watch_cache_size,
        tokens: authn.clone(),
        service_account_issuer: service_account_issuer(&args)?,
        anonymous: apiserver::authn::Anonymous::from_flag(
            args.anonymous_auth,
            authorization_modes.contains(&apiserver::authz::Mode::AlwaysAllow),
        ),
        authorization_modes,
        etcd: args.etcd_servers.iter().any(|s| !s.is_empty()),
        endpoint_reconciler: args.endpoint_reconciler_type == "lease",
        proxy_client: args.proxy_client_cert_file.clone().zip(args.proxy_client_key_file.clone()),
        aggregator_resync,
    };
    let state = apiserver::build_state(store, &opts)?;
    let _crds = apiserver::crds::spawn(state.registry.clone());
    let event_ttl =
        apiserver::parse_go_duration(&args.event_ttl).map_err(|e| anyhow::anyhow!("invalid --event-ttl: {e}"))?;
    let _event_ttl = apiserver::eventttl::spawn(state.registry.clone(), event_ttl);
    let _trimmer = common::memory::spawn_trimmer(common::memory::TRIM_INTERVAL);
    // Storage may be briefly unavailable (etcd starting): retry the bootstrap.
    let mut delay = Duration::from_millis(200);
    loop {
        match apiserver::bootstrap(&state, &opts).await {
            Ok(()) => break,
            Err(e) if e.code == 503 => {
                tracing::warn!(error = %e, "storage unavailable during bootstrap; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err(e) => anyhow::bail!("bootstrap failed: {e}"),
        }
    }
    apiserver::start_authorization(&state).await.context("starting authorization")?;
    apiserver::start_aggregation(&state).await.context("starting API aggregation")?;
    // The lease that keeps this apiserver in the kubernetes Service's endpoints, renewed
    // until shutdown, when it takes this apiserver out of them.
    let reconciler = opts
        .endpoint()
        .map(|me| tokio::spawn(apiserver::endpointreconciler::run(state.registry.clone(), me, shutdown_signal())));
    let listen = |port: u16| {
        let bind = args.bind_address.clone();
        async move {
            let addr: SocketAddr =
                format!("{bind}:{port}").parse().with_context(|| format!("invalid --bind-address {bind:?}"))?;
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr}"))
                .map(|l| (l, addr))
        }
    };
    if args.insecure_port != 0 {
        let addr: SocketAddr = format!("{}:{}", args.insecure_bind_address, args.insecure_port)
            .parse()
            .with_context(|| format!("invalid --insecure-bind-address {:?}", args.insecure_bind_address))?;
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))?;
        tracing::warn!(%addr, "serving the Kubernetes API without authentication (--insecure-port)");
        // As kube-apiserver's insecure port: its requests are a superuser's.
        let app = apiserver::authz::insecure(apiserver::server::router(state.clone()));
        tokio::spawn(common::serve::serve(listener, app, shutdown_signal(), common::serve::IDLE_TIMEOUT));
    }
    // Authentication outside authorization: the authorizer reads the user it put in.
    let authz = state.authz.clone();
    let authenticators = state.authenticators.clone();
    let mut app = apiserver::authz::layer(apiserver::server::router(state), authz);
    if authn.is_some() || args.client_ca_file.is_some() {
        app = apiserver::authn::layer(app, authenticators);
    }
    let idle = common::serve::IDLE_TIMEOUT;
    let mut servers: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> = Vec::new();
    if let Some(config) = tls {
        let (listener, addr) = listen(args.secure_port).await?;
        tracing::info!(%addr, client_ca = ?args.client_ca_file, "serving the Kubernetes API over HTTPS");
        let user_of: common::serve::PeerUser<_> =
            |der| apiserver::authn::user_of_certificate(der).map(apiserver::authn::CertificateUser);
        servers.push(Box::pin(common::serve::serve_tls(
            listener,
            app.clone(),
            config,
            user_of,
            shutdown_signal(),
            idle,
        )));
    }
    if plain_port != 0 {
        let (listener, addr) = listen(plain_port).await?;
        tracing::info!(%addr, "serving the Kubernetes API over plain HTTP");
        servers.push(Box::pin(common::serve::serve(listener, app, shutdown_signal(), idle)));
    }
    anyhow::ensure!(!servers.is_empty(), "no listener: --port 0 without --tls-cert-file");
    // Graceful shutdown lets requests finish, but a watch never finishes on its own: after
    // the signal, open connections get SHUTDOWN_GRACE and are then dropped with the process.
    tokio::select! {
        _ = futures::future::join_all(servers) => {}
        _ = async { shutdown_signal().await; tokio::time::sleep(SHUTDOWN_GRACE).await } => {
            tracing::info!(grace = ?SHUTDOWN_GRACE, "closing the connections still open (watches)");
        }
    }
    if let Some(r) = reconciler {
        let _ = tokio::time::timeout(Duration::from_secs(3), r).await;
    }
    Ok(())
}

/// How long requests in flight (and watches) may run on after SIGTERM.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down");
}
