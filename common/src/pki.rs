//! The cluster's certificates, as kubeadm lays them out: one CA, the apiserver's serving
//! certificate, and a client certificate per identity, whose subject names the user (CN)
//! and its groups (O) — what the apiserver's x509 authenticator reads.
//!
//! Everything here is pure (no file access): [`Pki::plan`] takes what exists (PEM text by
//! file name) and what is wanted ([`Spec`]) and returns the files to write. The I/O shell
//! is `minik8s-supervisor certs`. Keys are ECDSA P-256 (kubeadm's `ECDSA-P256`; ring
//! cannot generate RSA keys); the CA is valid for 10 years, leaves for one, as kubeadm's.

use std::collections::BTreeMap;
use std::net::IpAddr;

use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber,
};
use sha2::Digest;
use time::{Duration, OffsetDateTime};

/// How long the CA is valid (kubeadm: 10 years).
pub const CA_VALIDITY: Duration = Duration::days(3650);
/// How long a leaf certificate is valid (kubeadm: 1 year).
pub const LEAF_VALIDITY: Duration = Duration::days(365);
/// Certificates start this much before "now", so a clock a little behind accepts them
/// (kubeadm backdates by 5 minutes as well).
pub const BACKDATE: Duration = Duration::minutes(5);
/// A CA or leaf expiring sooner than this is replaced by `init`.
pub const RENEW_BEFORE: Duration = Duration::days(30);

/// The files of the CA.
pub const CA_CERT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
/// The apiserver's serving certificate (followed by the CA, so clients may read the chain).
pub const APISERVER_CERT: &str = "apiserver.crt";
pub const APISERVER_KEY: &str = "apiserver.key";
/// The apiserver's client certificate towards kubelets.
pub const KUBELET_CLIENT_CERT: &str = "apiserver-kubelet-client.crt";
pub const KUBELET_CLIENT_KEY: &str = "apiserver-kubelet-client.key";
/// The ServiceAccount token signing key and its public half (kubeadm's `sa.key`, `sa.pub`):
/// made once and kept through renewals, as a new key would void every token issued.
pub const SA_KEY: &str = "sa.key";
pub const SA_PUB: &str = "sa.pub";
/// etcd's own CA (kubeadm's `etcd/ca`): etcd trusts only the clients it signed, so a
/// certificate of the cluster CA (a kubelet's, a user's) opens no door to the store.
pub const ETCD_CA_CERT: &str = "etcd-ca.crt";
pub const ETCD_CA_KEY: &str = "etcd-ca.key";
/// What every control-plane machine of one cluster shares (kubeadm's `--upload-certs`): the
/// CAs and the ServiceAccount key; each issues its own leaves from them.
pub const SHARED_FILES: [&str; 6] = [CA_CERT, CA_KEY, SA_KEY, SA_PUB, ETCD_CA_CERT, ETCD_CA_KEY];

/// The cluster administrator (kubeadm's `kubernetes-admin`).
pub const ADMIN_USER: &str = "kubernetes-admin";
/// The group every request of which is allowed (Kubernetes' superuser group).
pub const MASTERS_GROUP: &str = "system:masters";

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("generating a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{file}: {reason}")]
    Invalid { file: String, reason: String },
    #[error("{0}")]
    Spec(String),
}

/// What a certificate is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Usage {
    /// TLS server (serverAuth), valid for these DNS names and IP addresses.
    Server(Vec<String>),
    /// TLS client (clientAuth).
    Client,
    /// Both, valid for these names (an etcd member towards its peers).
    Peer(Vec<String>),
}

/// One certificate to issue from the CA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leaf {
    /// The certificate's file name without extension (`apiserver` → `apiserver.crt`/`.key`),
    /// or the kubeconfig's file name when `kubeconfig` is set.
    pub name: String,
    /// The subject's CN: the user name.
    pub common_name: String,
    /// The subject's O values: the user's groups.
    pub organizations: Vec<String>,
    pub usage: Usage,
    /// Written as a kubeconfig with embedded data (`<name>`) instead of `.crt`/`.key` files.
    pub kubeconfig: bool,
}

impl Leaf {
    pub fn client(name: &str, user: &str, groups: &[&str]) -> Leaf {
        Leaf {
            name: name.to_string(),
            common_name: user.to_string(),
            organizations: groups.iter().map(|g| g.to_string()).collect(),
            usage: Usage::Client,
            kubeconfig: true,
        }
    }
}

/// What a cluster's PKI holds: recorded beside the files (`pki.json`) so `renew` issues the
/// same set again.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// The nodes, each with a kubelet identity `system:node:<name>`.
    #[serde(default)]
    pub nodes: Vec<String>,
    /// Extra names and addresses of the apiserver's serving certificate.
    #[serde(default)]
    pub sans: Vec<String>,
    /// The Service CIDR: its first address (the `kubernetes` Service) is a SAN.
    pub service_cluster_ip_range: String,
    /// The apiserver URL written into the kubeconfigs.
    pub server: String,
}

/// The DNS names and IPs of the apiserver's serving certificate: the given ones, the
/// in-cluster names of the `kubernetes` Service and its cluster IP, and loopback.
pub fn apiserver_sans(spec: &Spec) -> Result<Vec<String>, PkiError> {
    let mut out: Vec<String> = Vec::new();
    let mut add = |s: String| {
        if !s.is_empty() && !out.contains(&s) {
            out.push(s);
        }
    };
    for s in &spec.sans {
        add(s.trim().to_string());
    }
    for n in &spec.nodes {
        add(n.clone());
    }
    if let Some(host) = url_host(&spec.server) {
        add(host);
    }
    for n in ["kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"] {
        add(n.to_string());
    }
    add(first_service_ip(&spec.service_cluster_ip_range)?.to_string());
    add("localhost".to_string());
    add("127.0.0.1".to_string());
    Ok(out)
}

/// The names and IPs of a serving certificate for another port of the apiserver's machine
/// (the module controller's kubelet API): the given ones, the nodes, the apiserver URL's
/// host, and loopback.
pub fn host_sans(spec: &Spec) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let names = spec.sans.iter().map(|s| s.trim().to_string()).chain(spec.nodes.iter().cloned());
    for s in names.chain(url_host(&spec.server)).chain(["localhost".to_string(), "127.0.0.1".to_string()]) {
        if !s.is_empty() && !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

/// The host of `https://host:port[/…]` (brackets of an IPv6 address removed).
fn url_host(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split('/').next()?;
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next()?,
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    (!host.is_empty()).then(|| host.to_string())
}

/// The first usable address of a CIDR (the `kubernetes` Service's cluster IP).
pub fn first_service_ip(cidr: &str) -> Result<IpAddr, PkiError> {
    let bad = || PkiError::Spec(format!("invalid service CIDR {cidr:?}"));
    let (addr, bits) = cidr.split_once('/').ok_or_else(bad)?;
    let addr: IpAddr = addr.parse().map_err(|_| bad())?;
    let bits: u32 = bits.parse().map_err(|_| bad())?;
    Ok(match addr {
        IpAddr::V4(v4) if bits < 32 => {
            let mask = if bits == 0 { 0 } else { u32::MAX << (32 - bits) };
            IpAddr::V4((u32::from(v4) & mask).wrapping_add(1).into())
        }
        IpAddr::V6(v6) if bits < 128 => {
            let mask = if bits == 0 { 0 } else { u128::MAX << (128 - bits) };
            IpAddr::V6((u128::from(v6) & mask).wrapping_add(1).into())
        }
        _ => return Err(bad()),
    })
}

/// Every certificate a cluster of this spec needs, besides the CA.
pub fn leaves(spec: &Spec) -> Result<Vec<Leaf>, PkiError> {
    let mut out = vec![
        Leaf {
            name: "apiserver".into(),
            common_name: "kube-apiserver".into(),
            organizations: vec![],
            usage: Usage::Server(apiserver_sans(spec)?),
            kubeconfig: false,
        },
        Leaf {
            name: "apiserver-kubelet-client".into(),
            common_name: "kube-apiserver-kubelet-client".into(),
            organizations: vec![MASTERS_GROUP.into()],
            usage: Usage::Client,
            kubeconfig: false,
        },
        Leaf::client("admin.conf", ADMIN_USER, &[MASTERS_GROUP]),
        Leaf::client("scheduler.conf", "system:kube-scheduler", &[]),
        Leaf::client("controller-manager.conf", "system:kube-controller-manager", &[]),
        Leaf::client("cloud-controller-manager.conf", "system:cloud-controller-manager", &[]),
        Leaf::client("kube-proxy.conf", "system:kube-proxy", &[]),
        // The monitoring add-on's identities (`scripts/cluster up --monitoring` binds their
        // roles): Prometheus reads `/metrics` as a member of system:monitoring.
        Leaf::client("prometheus.conf", "prometheus", &["system:monitoring"]),
        Leaf::client("kube-state-metrics.conf", "kube-state-metrics", &[]),
        // The service mesh's control plane (`scripts/cluster up --mesh` binds its role).
        Leaf::client("pilot.conf", "istiod", &[]),
        // Koupleless' module controller (`scripts/cluster up --modules` binds its role), and
        // the serving certificate of the kubelet API it serves for its virtual nodes (which the
        // apiserver verifies, as it verifies kubelets).
        Leaf::client("module-controller.conf", "module-controller", &[]),
        Leaf {
            name: "module-controller-serving".into(),
            common_name: "module-controller".into(),
            organizations: vec![],
            usage: Usage::Server(host_sans(spec)),
            kubeconfig: false,
        },
        // The dashboard's HTTPS: browsers that trust the cluster's CA trust it. (The
        // dashboard has no client identity: it calls the API with each person's own.)
        Leaf {
            name: "dashboard-serving".into(),
            common_name: "minik8s-dashboard".into(),
            organizations: vec![],
            usage: Usage::Server(host_sans(spec)),
            kubeconfig: false,
        },
    ];
    for n in &spec.nodes {
        if n.is_empty() || n.contains(['/', '\0']) || n.starts_with('.') {
            return Err(PkiError::Spec(format!("invalid node name {n:?}")));
        }
        out.push(Leaf::client(&format!("kubelet-{n}.conf"), &format!("system:node:{n}"), &["system:nodes"]));
    }
    Ok(out)
}

/// The certificates etcd's CA signs: each member's serving and peer certificates (for
/// loopback and this machine's names) and the clients etcd admits: the apiserver and the
/// administrator's `etcdctl` (kubeadm's `healthcheck-client`).
pub fn etcd_leaves(spec: &Spec) -> Vec<Leaf> {
    let names = host_sans(spec);
    let leaf = |name: &str, cn: &str, usage: Usage| Leaf {
        name: name.into(),
        common_name: cn.into(),
        organizations: vec![],
        usage,
        kubeconfig: false,
    };
    vec![
        leaf("etcd-server", "kube-etcd", Usage::Server(names.clone())),
        leaf("etcd-peer", "kube-etcd-peer", Usage::Peer(names)),
        leaf("apiserver-etcd-client", "kube-apiserver-etcd-client", Usage::Client),
        leaf("etcd-healthcheck-client", "kube-etcd-healthcheck-client", Usage::Client),
    ]
}

/// The CA: its certificate and key (PEM).
#[derive(Clone, Debug)]
pub struct Ca {
    pub cert_pem: String,
    pub key_pem: String,
}

fn serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f; // positive
    SerialNumber::from_slice(&bytes)
}

impl Ca {
    /// A new self-signed CA (CN `kubernetes`, as kubeadm names it).
    pub fn generate(now: OffsetDateTime) -> Result<Ca, PkiError> {
        Ca::generate_named("kubernetes", now)
    }

    /// A new self-signed CA with the common name `cn`.
    pub fn generate_named(cn: &str, now: OffsetDateTime) -> Result<Ca, PkiError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyCertSign];
        params.not_before = now - BACKDATE;
        params.not_after = now + CA_VALIDITY;
        params.serial_number = Some(serial());
        let cert = params.self_signed(&key)?;
        Ok(Ca { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }

    /// Issue `leaf`: its certificate and a new key (PEM).
    pub fn issue(&self, leaf: &Leaf, now: OffsetDateTime) -> Result<(String, String), PkiError> {
        let invalid = |reason: String| PkiError::Invalid { file: CA_CERT.into(), reason };
        let ca_key = KeyPair::from_pem(&self.key_pem).map_err(|e| invalid(format!("the CA key: {e}")))?;
        let issuer = Issuer::from_ca_cert_pem(&self.cert_pem, ca_key).map_err(|e| invalid(e.to_string()))?;
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        // rcgen keeps one attribute per type: a second O goes in under O's OID spelled as a
        // type of its own (what x509 readers, the apiserver's included, read as a second O).
        match leaf.organizations.as_slice() {
            [] => {}
            [o] => params.distinguished_name.push(DnType::OrganizationName, o.as_str()),
            [o1, o2] => {
                params.distinguished_name.push(DnType::OrganizationName, o1.as_str());
                params.distinguished_name.push(DnType::CustomDnType(vec![2, 5, 4, 10]), o2.as_str());
            }
            _ => return Err(PkiError::Spec("a certificate names at most two organizations (O)".into())),
        }
        params.distinguished_name.push(DnType::CommonName, leaf.common_name.as_str());
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.use_authority_key_identifier_extension = true;
        params.not_before = now - BACKDATE;
        params.not_after = now + LEAF_VALIDITY;
        params.serial_number = Some(serial());
        let names = match &leaf.usage {
            Usage::Server(names) => {
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
                names.as_slice()
            }
            Usage::Peer(names) => {
                params.extended_key_usages =
                    vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
                names.as_slice()
            }
            Usage::Client => {
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
                &[]
            }
        };
        for n in names {
            params.subject_alt_names.push(match n.parse::<IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName(
                    n.as_str().try_into().map_err(|e| PkiError::Spec(format!("invalid SAN {n:?}: {e}")))?,
                ),
            });
        }
        let cert = params.signed_by(&key, &issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

/// A serving certificate for `host` valid for `names` (DNS names and IPs), signed by a CA
/// made for it alone, as the kubelet makes its own when it is given none (Kubernetes'
/// `<host>@<time>` and `<host>-ca@<time>`): the certificate followed by that CA (PEM), and
/// the key. Nobody can verify it without that CA, which is why kube-apiserver does not
/// verify kubelets unless told a CA that signed their certificates.
pub fn self_signed_serving(host: &str, names: &[String], now: OffsetDateTime) -> Result<(String, String), PkiError> {
    let ca = Ca::generate_named(&format!("{host}-ca@{}", now.unix_timestamp()), now)?;
    let leaf = Leaf {
        name: host.to_string(),
        common_name: format!("{host}@{}", now.unix_timestamp()),
        organizations: vec![],
        usage: Usage::Server(names.to_vec()),
        kubeconfig: false,
    };
    let (cert, key) = ca.issue(&leaf, now)?;
    Ok((format!("{cert}{}", ca.cert_pem), key))
}

impl Ca {
    /// Sign a certificate signing request (PEM): the requester's subject, names and public
    /// key, for `usages` (Kubernetes' key usage names: `digital signature`, `key
    /// encipherment`, `client auth`, `server auth` …), valid from a little before `now` for
    /// `lifetime`. The certificate (PEM).
    pub fn sign_request(
        &self,
        csr_pem: &str,
        usages: &[String],
        lifetime: Duration,
        now: OffsetDateTime,
    ) -> Result<String, PkiError> {
        let invalid = |reason: String| PkiError::Invalid { file: CA_CERT.into(), reason };
        let ca_key = KeyPair::from_pem(&self.key_pem).map_err(|e| invalid(format!("the CA key: {e}")))?;
        let issuer = Issuer::from_ca_cert_pem(&self.cert_pem, ca_key).map_err(|e| invalid(e.to_string()))?;
        let mut csr = rcgen::CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|e| PkiError::Spec(format!("the certificate request: {e}")))?;
        let p = &mut csr.params;
        p.not_before = now - BACKDATE;
        p.not_after = now + lifetime;
        p.serial_number = Some(serial());
        p.is_ca = IsCa::ExplicitNoCa;
        p.use_authority_key_identifier_extension = true;
        p.key_usages = vec![];
        p.extended_key_usages = vec![];
        for u in usages {
            match u.as_str() {
                "digital signature" => p.key_usages.push(KeyUsagePurpose::DigitalSignature),
                "key encipherment" => p.key_usages.push(KeyUsagePurpose::KeyEncipherment),
                "content commitment" => p.key_usages.push(KeyUsagePurpose::ContentCommitment),
                "data encipherment" => p.key_usages.push(KeyUsagePurpose::DataEncipherment),
                "key agreement" => p.key_usages.push(KeyUsagePurpose::KeyAgreement),
                "client auth" => p.extended_key_usages.push(ExtendedKeyUsagePurpose::ClientAuth),
                "server auth" => p.extended_key_usages.push(ExtendedKeyUsagePurpose::ServerAuth),
                "code signing" => p.extended_key_usages.push(ExtendedKeyUsagePurpose::CodeSigning),
                "email protection" => p.extended_key_usages.push(ExtendedKeyUsagePurpose::EmailProtection),
                "timestamping" => p.extended_key_usages.push(ExtendedKeyUsagePurpose::TimeStamping),
                "ocsp signing" => p.extended_key_usages.push(ExtendedKeyUsagePurpose::OcspSigning),
                other => return Err(PkiError::Spec(format!("unsupported key usage {other:?}"))),
            }
        }
        Ok(csr.signed_by(&issuer)?.pem())
    }
}

/// What a certificate says, as far as the PKI cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertInfo {
    pub common_name: String,
    pub organizations: Vec<String>,
    /// DNS names and IP addresses.
    pub sans: Vec<String>,
    pub is_ca: bool,
    pub not_before: i64,
    pub not_after: i64,
    pub issuer: String,
    pub subject: String,
}

/// The current time, as the PKI's functions take it.
pub fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

/// A validity of `n` seconds, as the PKI's functions take it.
pub fn seconds(n: i64) -> Duration {
    Duration::seconds(n)
}

/// What a certificate signing request (PKCS#10) asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CsrInfo {
    pub common_name: String,
    pub organizations: Vec<String>,
    /// DNS names, IP addresses, e-mail addresses and URIs asked for.
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<String>,
    pub emails: Vec<String>,
    pub uris: Vec<String>,
}

/// The text values of a subject's attributes (CN, O …).
fn texts<'a>(attributes: impl Iterator<Item = &'a x509_parser::x509::AttributeTypeAndValue<'a>>) -> Vec<String> {
    attributes.filter_map(|a| a.as_str().ok().map(str::to_string)).collect()
}

/// Read a `CERTIFICATE REQUEST` PEM block and check its signature (the requester holds the
/// key). The error says what is wrong in words Kubernetes uses.
pub fn parse_csr(pem: &[u8]) -> Result<CsrInfo, String> {
    use x509_parser::prelude::*;
    let (_, block) = x509_parser::pem::parse_x509_pem(pem).map_err(|_| "PEM block type must be CERTIFICATE REQUEST")?;
    if block.label != "CERTIFICATE REQUEST" {
        return Err("PEM block type must be CERTIFICATE REQUEST".into());
    }
    let (_, csr) = X509CertificationRequest::from_der(&block.contents)
        .map_err(|e| format!("x509: malformed certificate request: {e}"))?;
    csr.verify_signature().map_err(|e| format!("x509: the request's signature is invalid: {e}"))?;
    let subject = &csr.certification_request_info.subject;
    let mut info = CsrInfo {
        common_name: texts(subject.iter_common_name()).into_iter().next().unwrap_or_default(),
        organizations: texts(subject.iter_organization()),
        dns_names: vec![],
        ip_addresses: vec![],
        emails: vec![],
        uris: vec![],
    };
    for ext in csr.requested_extensions().into_iter().flatten() {
        if let ParsedExtension::SubjectAlternativeName(san) = ext {
            for name in &san.general_names {
                match name {
                    GeneralName::DNSName(d) => info.dns_names.push(d.to_string()),
                    GeneralName::RFC822Name(e) => info.emails.push(e.to_string()),
                    GeneralName::URI(u) => info.uris.push(u.to_string()),
                    GeneralName::IPAddress(b) => info.ip_addresses.push(match b.len() {
                        4 => IpAddr::from(<[u8; 4]>::try_from(*b).unwrap_or_default()).to_string(),
                        16 => IpAddr::from(<[u8; 16]>::try_from(*b).unwrap_or_default()).to_string(),
                        _ => format!("{b:?}"),
                    }),
                    _ => {}
                }
            }
        }
    }
    Ok(info)
}

/// A new key and a certificate signing request for `common_name` in `organizations` (PEM:
/// request, key), as a kubelet asks for its client certificate.
pub fn new_csr(common_name: &str, organizations: &[&str]) -> Result<(String, String), PkiError> {
    new_csr_with_names(common_name, organizations, &[])
}

/// [`new_csr`] with subject alternative names (`names`: DNS names and IP addresses), as a
/// kubelet asks for its serving certificate.
pub fn new_csr_with_names(
    common_name: &str,
    organizations: &[&str],
    names: &[String],
) -> Result<(String, String), PkiError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(names.to_vec())?;
    params.distinguished_name = DistinguishedName::new();
    for o in organizations {
        params.distinguished_name.push(DnType::OrganizationName, *o);
    }
    params.distinguished_name.push(DnType::CommonName, common_name);
    let csr = params.serialize_request(&key)?;
    Ok((csr.pem()?, key.serialize_pem()))
}

/// The first certificate of a PEM text, DER-decoded.
pub fn pem_to_der(pem: &str) -> Option<Vec<u8>> {
    let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    (p.label == "CERTIFICATE").then_some(p.contents)
}

/// Read a certificate (DER).
pub fn inspect(der: &[u8]) -> Result<CertInfo, String> {
    use x509_parser::prelude::*;
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let subject = cert.subject();
    let sans = match cert.subject_alternative_name() {
        Ok(Some(ext)) => ext
            .value
            .general_names
            .iter()
            .filter_map(|n| match n {
                GeneralName::DNSName(d) => Some(d.to_string()),
                GeneralName::IPAddress(b) => match b.len() {
                    4 => Some(IpAddr::from(<[u8; 4]>::try_from(*b).ok()?).to_string()),
                    16 => Some(IpAddr::from(<[u8; 16]>::try_from(*b).ok()?).to_string()),
                    _ => None,
                },
                _ => None,
            })
            .collect(),
        _ => vec![],
    };
    let common_name = texts(subject.iter_common_name()).into_iter().next().unwrap_or_default();
    let organizations = texts(subject.iter_organization());
    Ok(CertInfo {
        common_name,
        organizations,
        sans,
        is_ca: cert.is_ca(),
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
        issuer: cert.issuer().to_string(),
        subject: subject.to_string(),
    })
}

/// Whether `cert` (DER) carries a valid signature of the CA (DER).
pub fn signed_by(cert: &[u8], ca: &[u8]) -> bool {
    use x509_parser::prelude::*;
    let (Ok((_, cert)), Ok((_, ca))) = (X509Certificate::from_der(cert), X509Certificate::from_der(ca)) else {
        return false;
    };
    cert.verify_signature(Some(ca.public_key())).is_ok()
}

/// The SHA-256 of the CA's SubjectPublicKeyInfo, as `sha256:<hex>`: kubeadm's
/// `--discovery-token-ca-cert-hash`, what a joining node pins the cluster's CA by.
pub fn ca_cert_hash(ca_der: &[u8]) -> Result<String, String> {
    use x509_parser::prelude::*;
    let (_, cert) = X509Certificate::from_der(ca_der).map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let spki = cert.tbs_certificate.subject_pki.raw;
    let digest = sha2::Sha256::digest(spki);
    Ok(format!("sha256:{}", digest.iter().map(|b| format!("{b:02x}")).collect::<String>()))
}

/// The name of the cluster in the kubeconfigs.
pub const CLUSTER_NAME: &str = "minik8s";

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// A kubeconfig for `user` with everything embedded, as kubeadm writes `admin.conf`:
/// `certificate-authority-data`, `client-certificate-data`, `client-key-data`.
pub fn kubeconfig(server: &str, ca_pem: &str, user: &str, cert_pem: &str, key_pem: &str) -> String {
    let context = format!("{user}@{CLUSTER_NAME}");
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CLUSTER_NAME, "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)}}],
        "users": [{"name": user, "user": {"client-certificate-data": b64(cert_pem), "client-key-data": b64(key_pem)}}],
        "contexts": [{"name": context, "context": {"cluster": CLUSTER_NAME, "user": user}}],
        "current-context": context,
        "preferences": {},
    });
    serde_yaml::to_string(&doc).unwrap_or_default()
}

/// The server, CA and client certificate of a kubeconfig this module wrote.
fn read_kubeconfig(text: &str) -> Option<(String, String, String)> {
    let doc: serde_json::Value = serde_yaml::from_str(text).ok()?;
    let field = |ptr: &str| doc.pointer(ptr).and_then(|v| v.as_str()).map(str::to_string);
    let decode =
        |s: String| base64::engine::general_purpose::STANDARD.decode(s).ok().and_then(|b| String::from_utf8(b).ok());
    Some((
        field("/clusters/0/cluster/server")?,
        decode(field("/clusters/0/cluster/certificate-authority-data")?)?,
        decode(field("/users/0/user/client-certificate-data")?)?,
    ))
}

/// Whether an existing CA can go on signing: a CA certificate, valid for a while yet, whose
/// key is the one beside it.
fn usable_ca(ca: &Ca, now: OffsetDateTime) -> Result<(), String> {
    use x509_parser::prelude::*;
    let der = self::pem_to_der(&ca.cert_pem).ok_or("not a PEM certificate")?;
    let (_, cert) = X509Certificate::from_der(&der).map_err(|e| format!("not an X.509 certificate: {e}"))?;
    if !cert.is_ca() {
        return Err("not a CA certificate".into());
    }
    if cert.validity().not_after.timestamp() < (now + RENEW_BEFORE).unix_timestamp() {
        return Err(format!("expires {}", cert.validity().not_after));
    }
    let key = KeyPair::from_pem(&ca.key_pem).map_err(|e| format!("its key: {e}"))?;
    if key.public_key_raw() != &cert.public_key().subject_public_key.data[..] {
        return Err("the key beside it is not its key".into());
    }
    Ok(())
}

/// Whether an issued certificate (PEM) still matches `leaf` and the CA and has time left.
fn leaf_current(cert_pem: &str, leaf: &Leaf, ca_der: &[u8], now: OffsetDateTime) -> bool {
    let Some(der) = pem_to_der(cert_pem) else { return false };
    let Ok(info) = inspect(&der) else { return false };
    let sans_match = match &leaf.usage {
        Usage::Server(names) | Usage::Peer(names) => {
            let (mut a, mut b) = (info.sans.clone(), names.clone());
            a.sort();
            b.sort();
            a == b
        }
        Usage::Client => true,
    };
    signed_by(&der, ca_der)
        && info.common_name == leaf.common_name
        && info.organizations == leaf.organizations
        && sans_match
        && info.not_after >= (now + RENEW_BEFORE).unix_timestamp()
}

/// What to do with a PKI directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Create what is missing or stale; keep a usable CA and every current certificate.
    Init,
    /// Issue every leaf again from the existing CA (which must be usable).
    Renew,
}

/// The files to write (name → contents) so that the directory whose files are `existing`
/// (name → contents) holds the PKI of `spec`. Pure but for the randomness of keys.
pub fn plan(
    existing: &BTreeMap<String, String>,
    spec: &Spec,
    mode: Mode,
    now: OffsetDateTime,
) -> Result<BTreeMap<String, String>, PkiError> {
    let mut out = BTreeMap::new();
    let signers =
        [(CA_CERT, CA_KEY, "kubernetes", leaves(spec)?), (ETCD_CA_CERT, ETCD_CA_KEY, "etcd-ca", etcd_leaves(spec))];
    for (cert_file, key_file, cn, leaves) in signers {
        let (ca, fresh) = plan_ca(existing, cert_file, key_file, cn, mode, now, &mut out)?;
        // A new CA, or a renewal, issues every leaf again.
        let keep_current = !fresh && mode == Mode::Init;
        plan_leaves(existing, spec, &ca, keep_current, &leaves, now, &mut out)?;
    }
    let invalid = |file: &str, reason: String| PkiError::Invalid { file: file.to_string(), reason };
    match (existing.get(SA_KEY), existing.contains_key(SA_PUB)) {
        (None, _) => {
            let key = KeyPair::generate()?;
            out.insert(SA_KEY.to_string(), key.serialize_pem());
            out.insert(SA_PUB.to_string(), key.public_key_pem());
        }
        (Some(pem), false) => {
            let key = KeyPair::from_pem(pem).map_err(|e| invalid(SA_KEY, format!("not a private key: {e}")))?;
            out.insert(SA_PUB.to_string(), key.public_key_pem());
        }
        (Some(_), true) => {}
    }
    Ok(out)
}

/// The CA kept in `cert_file`/`key_file` if it is usable, else a new one (added to `out`;
/// then `true`).
fn plan_ca(
    existing: &BTreeMap<String, String>,
    cert_file: &str,
    key_file: &str,
    cn: &str,
    mode: Mode,
    now: OffsetDateTime,
    out: &mut BTreeMap<String, String>,
) -> Result<(Ca, bool), PkiError> {
    let invalid = |file: &str, reason: String| PkiError::Invalid { file: file.to_string(), reason };
    match (existing.get(cert_file), existing.get(key_file)) {
        (Some(cert), Some(key)) => {
            let ca = Ca { cert_pem: cert.clone(), key_pem: key.clone() };
            match usable_ca(&ca, now) {
                Ok(()) => return Ok((ca, false)),
                Err(reason) if mode == Mode::Renew => {
                    return Err(invalid(cert_file, format!("{reason}; cannot renew from it (init makes a new CA)")))
                }
                Err(reason) => {
                    tracing::warn!(%reason, file = cert_file, "the existing CA is not usable; making a new one")
                }
            }
        }
        (Some(_), None) => {
            return Err(invalid(key_file, "missing: the CA certificate exists without its key".into()));
        }
        _ if mode == Mode::Renew => return Err(invalid(cert_file, "missing: run init first".into())),
        _ => {}
    }
    let ca = Ca::generate_named(cn, now)?;
    out.insert(cert_file.to_string(), ca.cert_pem.clone());
    out.insert(key_file.to_string(), ca.key_pem.clone());
    Ok((ca, true))
}

/// The leaves of `ca` to issue (again): those missing, stale or not of this CA, or every one
/// unless `keep_current`.
fn plan_leaves(
    existing: &BTreeMap<String, String>,
    spec: &Spec,
    ca: &Ca,
    keep_current: bool,
    leaves: &[Leaf],
    now: OffsetDateTime,
    out: &mut BTreeMap<String, String>,
) -> Result<(), PkiError> {
    let ca_der = pem_to_der(&ca.cert_pem)
        .ok_or_else(|| PkiError::Invalid { file: CA_CERT.into(), reason: "not a PEM certificate".into() })?;
    for leaf in leaves {
        let current = keep_current
            && if leaf.kubeconfig {
                existing.get(&leaf.name).and_then(|t| read_kubeconfig(t)).is_some_and(|(server, ca_pem, cert)| {
                    server == spec.server && ca_pem == ca.cert_pem && leaf_current(&cert, leaf, &ca_der, now)
                })
            } else {
                existing.contains_key(&format!("{}.key", leaf.name))
                    && existing.get(&format!("{}.crt", leaf.name)).is_some_and(|c| leaf_current(c, leaf, &ca_der, now))
            };
        if current {
            continue;
        }
        let (cert, key) = ca.issue(leaf, now)?;
        if leaf.kubeconfig {
            out.insert(leaf.name.clone(), kubeconfig(&spec.server, &ca.cert_pem, &leaf.common_name, &cert, &key));
        } else {
            // A server sends its chain: the leaf, then the CA.
            let serves = matches!(leaf.usage, Usage::Server(_) | Usage::Peer(_));
            let chain = if serves { format!("{cert}{}", ca.cert_pem) } else { cert };
            out.insert(format!("{}.crt", leaf.name), chain);
            out.insert(format!("{}.key", leaf.name), key);
        }
    }
    Ok(())
}

/// A client identity's kubeconfig issued from the CA: for a user of one's own
/// (`certs kubeconfig --user jane --group devs`).
pub fn user_kubeconfig(
    ca: &Ca,
    server: &str,
    user: &str,
    groups: &[String],
    now: OffsetDateTime,
) -> Result<String, PkiError> {
    if user.is_empty() {
        return Err(PkiError::Spec("the user name (CN) must not be empty".into()));
    }
    if groups.len() > 2 {
        return Err(PkiError::Spec("a certificate names at most two groups (O)".into()));
    }
    let leaf = Leaf {
        name: String::new(),
        common_name: user.to_string(),
        organizations: groups.to_vec(),
        usage: Usage::Client,
        kubeconfig: true,
    };
    usable_ca(ca, now).map_err(|reason| PkiError::Invalid { file: CA_CERT.into(), reason })?;
    let (cert, key) = ca.issue(&leaf, now)?;
    Ok(kubeconfig(server, &ca.cert_pem, user, &cert, &key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Spec {
        Spec {
            nodes: vec!["node-1".into(), "node-2".into()],
            sans: vec!["192.0.2.7".into(), "api.example".into()],
            service_cluster_ip_range: "10.96.0.0/12".into(),
            server: "https://192.0.2.7:6443".into(),
        }
    }

    fn now() -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_750_000_000).unwrap()
    }

    fn cert_of(files: &BTreeMap<String, String>, name: &str) -> CertInfo {
        let pem = match files.get(name) {
            Some(t) if name.ends_with(".conf") => read_kubeconfig(t).unwrap().2,
            Some(t) => t.clone(),
            None => panic!("{name} not written: {:?}", files.keys().collect::<Vec<_>>()),
        };
        inspect(&pem_to_der(&pem).unwrap()).unwrap()
    }

    #[test]
    fn service_ip_and_sans() {
        assert_eq!(first_service_ip("10.96.0.0/12").unwrap().to_string(), "10.96.0.1");
        assert_eq!(first_service_ip("10.100.7.9/16").unwrap().to_string(), "10.100.0.1");
        assert_eq!(first_service_ip("fd00::/108").unwrap().to_string(), "fd00::1");
        for bad in ["10.96.0.0", "10.96.0.0/33", "x/12", "10.0.0.1/32"] {
            assert!(first_service_ip(bad).is_err(), "{bad}");
        }
        let sans = apiserver_sans(&spec()).unwrap();
        for want in [
            "192.0.2.7",
            "api.example",
            "node-1",
            "node-2",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "10.96.0.1",
            "localhost",
            "127.0.0.1",
        ] {
            assert!(sans.contains(&want.to_string()), "{want} missing in {sans:?}");
        }
        assert_eq!(sans.iter().filter(|s| *s == "192.0.2.7").count(), 1, "the server's host once: {sans:?}");
        assert_eq!(url_host("https://[fd00::5]:6443"), Some("fd00::5".into()));
        assert_eq!(url_host("https://h.example:6443/x"), Some("h.example".into()));
    }

    #[test]
    fn init_makes_the_ca_the_serving_certificate_and_every_identity() {
        let files = plan(&BTreeMap::new(), &spec(), Mode::Init, now()).unwrap();
        let ca = cert_of(&files, CA_CERT);
        assert!(ca.is_ca && ca.common_name == "kubernetes");
        assert_eq!(ca.not_after - ca.not_before, (CA_VALIDITY + BACKDATE).whole_seconds());
        assert!(ca.not_before < now().unix_timestamp(), "backdated");

        let server = cert_of(&files, APISERVER_CERT);
        assert!(!server.is_ca);
        assert_eq!(server.issuer, ca.subject);
        let mut sans = server.sans.clone();
        sans.sort();
        let mut want = apiserver_sans(&spec()).unwrap();
        want.sort();
        assert_eq!(sans, want);
        assert_eq!(server.not_after - server.not_before, (LEAF_VALIDITY + BACKDATE).whole_seconds());
        assert_eq!(files[APISERVER_CERT].matches("BEGIN CERTIFICATE").count(), 2, "leaf + CA chain");
        assert!(files[APISERVER_KEY].contains("PRIVATE KEY"));

        // The module controller's kubelet API: the machine's names, not the kubernetes Service's.
        let vk = cert_of(&files, "module-controller-serving.crt");
        assert_eq!(vk.issuer, ca.subject);
        assert!(vk.sans.contains(&"192.0.2.7".to_string()) && vk.sans.contains(&"127.0.0.1".to_string()), "{vk:?}");
        assert!(!vk.sans.iter().any(|s| s.starts_with("kubernetes") || s == "10.96.0.1"), "{vk:?}");

        let ca_der = pem_to_der(&files[CA_CERT]).unwrap();
        for (file, cn, orgs) in [
            ("admin.conf", "kubernetes-admin", vec!["system:masters"]),
            ("scheduler.conf", "system:kube-scheduler", vec![]),
            ("controller-manager.conf", "system:kube-controller-manager", vec![]),
            ("cloud-controller-manager.conf", "system:cloud-controller-manager", vec![]),
            ("kube-proxy.conf", "system:kube-proxy", vec![]),
            ("prometheus.conf", "prometheus", vec!["system:monitoring"]),
            ("kube-state-metrics.conf", "kube-state-metrics", vec![]),
            ("pilot.conf", "istiod", vec![]),
            ("module-controller.conf", "module-controller", vec![]),
            ("kubelet-node-1.conf", "system:node:node-1", vec!["system:nodes"]),
            ("kubelet-node-2.conf", "system:node:node-2", vec!["system:nodes"]),
            (KUBELET_CLIENT_CERT, "kube-apiserver-kubelet-client", vec!["system:masters"]),
        ] {
            let info = cert_of(&files, file);
            assert_eq!(
                (info.common_name.as_str(), info.organizations.clone()),
                (cn, orgs.iter().map(|s| s.to_string()).collect()),
                "{file}"
            );
            assert!(info.sans.is_empty() && !info.is_ca, "{file}");
            let pem =
                if file.ends_with(".conf") { read_kubeconfig(&files[file]).unwrap().2 } else { files[file].clone() };
            assert!(signed_by(&pem_to_der(&pem).unwrap(), &ca_der), "{file} is signed by the CA");
        }
        let (server_url, ca_pem, _) = read_kubeconfig(&files["admin.conf"]).unwrap();
        assert_eq!((server_url.as_str(), ca_pem.as_str()), ("https://192.0.2.7:6443", files[CA_CERT].as_str()));
        assert!(!signed_by(
            &pem_to_der(&files[APISERVER_CERT]).unwrap(),
            &pem_to_der(&Ca::generate(now()).unwrap().cert_pem).unwrap()
        ));
    }

    #[test]
    fn the_kubeconfig_is_what_the_kube_crate_reads() {
        let files = plan(&BTreeMap::new(), &spec(), Mode::Init, now()).unwrap();
        let kc = kube::config::Kubeconfig::from_yaml(&files["admin.conf"]).unwrap();
        assert_eq!(kc.current_context.as_deref(), Some("kubernetes-admin@minik8s"));
        let cluster = kc.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://192.0.2.7:6443"));
        assert!(cluster.certificate_authority_data.is_some());
        let user = kc.auth_infos[0].auth_info.as_ref().unwrap();
        assert!(user.client_certificate_data.is_some() && user.client_key_data.is_some());
    }

    #[test]
    fn init_again_keeps_everything_and_renew_keeps_only_the_ca() {
        let first = plan(&BTreeMap::new(), &spec(), Mode::Init, now()).unwrap();
        assert!(plan(&first, &spec(), Mode::Init, now()).unwrap().is_empty(), "nothing to do");

        // A new node: only its kubeconfig; a new SAN: only the serving certificates.
        let mut more = spec();
        more.nodes.push("node-3".into());
        more.sans.push("10.1.2.3".into());
        let out = plan(&first, &more, Mode::Init, now()).unwrap();
        assert_eq!(
            out.keys().collect::<Vec<_>>(),
            [
                APISERVER_CERT,
                APISERVER_KEY,
                "dashboard-serving.crt",
                "dashboard-serving.key",
                "etcd-peer.crt",
                "etcd-peer.key",
                "etcd-server.crt",
                "etcd-server.key",
                "kubelet-node-3.conf",
                "module-controller-serving.crt",
                "module-controller-serving.key"
            ]
        );
        // Another server URL: every kubeconfig.
        let mut moved = spec();
        moved.server = "https://192.0.2.8:6443".into();
        let out = plan(&first, &moved, Mode::Init, now()).unwrap();
        assert!(
            out.contains_key("admin.conf") && out.contains_key("kubelet-node-1.conf") && !out.contains_key(CA_CERT)
        );

        // Renewal: every leaf again, from the same CA.
        let later = now() + Duration::days(200);
        let renewed = plan(&first, &spec(), Mode::Renew, later).unwrap();
        assert!(!renewed.contains_key(CA_CERT) && !renewed.contains_key(CA_KEY), "the CA stays");
        assert!(first.contains_key(SA_KEY) && first.contains_key(SA_PUB));
        assert!(!renewed.contains_key(SA_KEY), "the ServiceAccount key stays: a new one voids every token");
        let mut without_pub = first.clone();
        without_pub.remove(SA_PUB);
        let out = plan(&without_pub, &spec(), Mode::Init, now()).unwrap();
        assert_eq!(out.get(SA_PUB), first.get(SA_PUB), "the public half is derived again from the key");
        let ca_der = pem_to_der(&first[CA_CERT]).unwrap();
        for name in ["admin.conf", "kubelet-node-2.conf", APISERVER_CERT, KUBELET_CLIENT_CERT] {
            let old = cert_of(&first, name);
            let new = cert_of(&renewed, name);
            assert_eq!(new.not_after - later.unix_timestamp(), LEAF_VALIDITY.whole_seconds(), "{name}");
            assert!(new.not_after > old.not_after && new.common_name == old.common_name, "{name}");
        }
        let admin = read_kubeconfig(&renewed["admin.conf"]).unwrap();
        assert_eq!(admin.1, first[CA_CERT], "the kubeconfig embeds the same CA");
        assert!(signed_by(&pem_to_der(&admin.2).unwrap(), &ca_der));

        // Near its end a leaf is replaced by init; an expiring CA replaces everything.
        let out = plan(&first, &spec(), Mode::Init, now() + LEAF_VALIDITY - Duration::days(10)).unwrap();
        assert!(out.contains_key("admin.conf") && !out.contains_key(CA_CERT));
        let out = plan(&first, &spec(), Mode::Init, now() + CA_VALIDITY).unwrap();
        assert!(out.contains_key(CA_CERT) && out.contains_key("admin.conf"));
        let err = plan(&first, &spec(), Mode::Renew, now() + CA_VALIDITY).unwrap_err();
        assert!(err.to_string().contains("cannot renew"), "{err}");
    }

    #[test]
    fn etcd_has_a_ca_of_its_own_and_a_joining_control_plane_issues_its_leaves_from_the_shared_cas() {
        let files = plan(&BTreeMap::new(), &spec(), Mode::Init, now()).unwrap();
        let (ca, etcd_ca) = (cert_of(&files, CA_CERT), cert_of(&files, ETCD_CA_CERT));
        assert!(etcd_ca.is_ca && etcd_ca.common_name == "etcd-ca" && etcd_ca.subject != ca.subject);
        let etcd_der = pem_to_der(&files[ETCD_CA_CERT]).unwrap();
        let ca_der = pem_to_der(&files[CA_CERT]).unwrap();
        for name in ["etcd-server.crt", "etcd-peer.crt", "apiserver-etcd-client.crt", "etcd-healthcheck-client.crt"] {
            let der = pem_to_der(&files[name]).unwrap();
            assert!(signed_by(&der, &etcd_der) && !signed_by(&der, &ca_der), "{name} is etcd's CA's alone");
        }
        // Members serve on loopback and this machine's addresses.
        let peer = cert_of(&files, "etcd-peer.crt");
        assert!(peer.sans.contains(&"192.0.2.7".to_string()) && peer.sans.contains(&"127.0.0.1".to_string()));
        // No leaf of the cluster CA is etcd's client.
        let admin = read_kubeconfig(&files["admin.conf"]).unwrap().2;
        assert!(!signed_by(&pem_to_der(&admin).unwrap(), &etcd_der));

        // Another control-plane machine: the shared files only, its own address.
        let shared: BTreeMap<String, String> =
            SHARED_FILES.iter().map(|f| (f.to_string(), files[*f].clone())).collect();
        let mut other = spec();
        other.sans = vec!["192.0.2.8".into()];
        other.server = "https://192.0.2.8:6443".into();
        let out = plan(&shared, &other, Mode::Init, now()).unwrap();
        assert!(SHARED_FILES.iter().all(|f| !out.contains_key(*f)), "the CAs and the ServiceAccount key are kept");
        let server = cert_of(&out, APISERVER_CERT);
        assert!(server.sans.contains(&"192.0.2.8".to_string()) && server.issuer == ca.subject);
        let peer = cert_of(&out, "etcd-peer.crt");
        assert!(peer.sans.contains(&"192.0.2.8".to_string()) && peer.issuer == etcd_ca.subject);
    }

    #[test]
    fn broken_or_foreign_files_are_not_kept() {
        let first = plan(&BTreeMap::new(), &spec(), Mode::Init, now()).unwrap();
        let other = plan(&BTreeMap::new(), &spec(), Mode::Init, now()).unwrap();
        // A leaf of another CA, a garbled kubeconfig: issued again.
        let mut mixed = first.clone();
        mixed.insert(APISERVER_CERT.into(), other[APISERVER_CERT].clone());
        mixed.insert("admin.conf".into(), "garbage: [".into());
        let out = plan(&mixed, &spec(), Mode::Init, now()).unwrap();
        assert_eq!(out.keys().collect::<Vec<_>>(), ["admin.conf", APISERVER_CERT, APISERVER_KEY]);
        // A CA key that is not the CA's: a new CA for init, an error for renew.
        let mut wrong_key = first.clone();
        wrong_key.insert(CA_KEY.into(), other[CA_KEY].clone());
        assert!(plan(&wrong_key, &spec(), Mode::Init, now()).unwrap().contains_key(CA_CERT));
        assert!(plan(&wrong_key, &spec(), Mode::Renew, now()).is_err());
        // A CA certificate without its key is an error either way (never overwritten).
        let mut no_key = first.clone();
        no_key.remove(CA_KEY);
        assert!(plan(&no_key, &spec(), Mode::Init, now()).unwrap_err().to_string().contains("without its key"));
        assert!(plan(&BTreeMap::new(), &spec(), Mode::Renew, now()).is_err(), "renew needs a CA");
        let mut bad = spec();
        bad.nodes.push("../x".into());
        assert!(plan(&BTreeMap::new(), &bad, Mode::Init, now()).is_err());
    }

    #[test]
    fn a_user_of_ones_own() {
        let files = plan(&BTreeMap::new(), &spec(), Mode::Init, now()).unwrap();
        let ca = Ca { cert_pem: files[CA_CERT].clone(), key_pem: files[CA_KEY].clone() };
        let kc = user_kubeconfig(&ca, "https://h:6443", "jane", &["devs".into()], now()).unwrap();
        let (_, _, cert) = read_kubeconfig(&kc).unwrap();
        let info = inspect(&pem_to_der(&cert).unwrap()).unwrap();
        assert_eq!((info.common_name.as_str(), info.organizations.clone()), ("jane", vec!["devs".to_string()]));
        // Two groups: both are O attributes the apiserver (and tenant-proxy) read; three are refused.
        let kc = user_kubeconfig(&ca, "https://h:6443", "jane", &["tenant:acme".into(), "devs".into()], now()).unwrap();
        let (_, _, cert) = read_kubeconfig(&kc).unwrap();
        let info = inspect(&pem_to_der(&cert).unwrap()).unwrap();
        assert_eq!(info.organizations, vec!["tenant:acme".to_string(), "devs".to_string()]);
        let three = ["a".to_string(), "b".into(), "c".into()];
        assert!(user_kubeconfig(&ca, "https://h:6443", "jane", &three, now()).is_err());
        assert!(user_kubeconfig(&ca, "https://h:6443", "", &[], now()).is_err());
    }

    #[test]
    fn ca_hash_is_the_spki_digest() {
        let files = plan(&BTreeMap::new(), &spec(), Mode::Init, now()).unwrap();
        let h = ca_cert_hash(&pem_to_der(&files[CA_CERT]).unwrap()).unwrap();
        assert!(h.starts_with("sha256:") && h.len() == 7 + 64, "{h}");
        assert_ne!(h, ca_cert_hash(&pem_to_der(&Ca::generate(now()).unwrap().cert_pem).unwrap()).unwrap());
    }

    #[test]
    fn a_self_signed_serving_certificate_names_its_host_and_comes_with_its_ca() {
        let now = OffsetDateTime::now_utc();
        let (chain, key) = self_signed_serving("node-1", &["node-1".into(), "10.0.0.7".into()], now).unwrap();
        let ders: Vec<Vec<u8>> =
            x509_parser::pem::Pem::iter_from_buffer(chain.as_bytes()).map(|p| p.unwrap().contents).collect();
        assert_eq!(ders.len(), 2, "the certificate and its CA");
        let (leaf, ca) = (inspect(&ders[0]).unwrap(), inspect(&ders[1]).unwrap());
        assert_eq!(leaf.sans, vec!["node-1".to_string(), "10.0.0.7".to_string()]);
        assert!(leaf.common_name.starts_with("node-1@") && ca.common_name.starts_with("node-1-ca@") && ca.is_ca);
        assert!(signed_by(&ders[0], &ders[1]));
        assert!(key.contains("PRIVATE KEY"));
    }

    #[test]
    fn a_request_is_read_checked_and_signed() {
        let ca = Ca::generate(now()).unwrap();
        let (csr, key) = new_csr("system:node:n1", &["system:nodes"]).unwrap();
        let info = parse_csr(csr.as_bytes()).unwrap();
        assert_eq!(
            (info.common_name.as_str(), info.organizations.clone()),
            ("system:node:n1", vec!["system:nodes".to_string()])
        );
        assert!(info.dns_names.is_empty() && info.ip_addresses.is_empty());
        let usages = vec!["digital signature".to_string(), "client auth".to_string()];
        let cert = ca.sign_request(&csr, &usages, Duration::hours(1), now()).unwrap();
        let der = pem_to_der(&cert).unwrap();
        let got = inspect(&der).unwrap();
        assert_eq!(got.common_name, "system:node:n1");
        assert!(signed_by(&der, &pem_to_der(&ca.cert_pem).unwrap()));
        assert!((got.not_after - now().unix_timestamp() - 3600).abs() <= 5);
        // The certificate is for the request's key.
        let pair = KeyPair::from_pem(&key).unwrap();
        let (_, parsed) = x509_parser::parse_x509_certificate(&der).unwrap();
        assert_eq!(parsed.public_key().subject_public_key.data.as_ref(), pair.public_key_raw());
        // Not a request, a request with a broken signature.
        assert_eq!(parse_csr(ca.cert_pem.as_bytes()).unwrap_err(), "PEM block type must be CERTIFICATE REQUEST");
        let der = x509_parser::pem::parse_x509_pem(csr.as_bytes()).unwrap().1.contents;
        let mut broken = der.clone();
        let last = broken.len() - 1;
        broken[last] ^= 1;
        let b64 = base64::engine::general_purpose::STANDARD.encode(&broken);
        let pem = format!("-----BEGIN CERTIFICATE REQUEST-----\n{b64}\n-----END CERTIFICATE REQUEST-----\n");
        assert!(parse_csr(pem.as_bytes()).unwrap_err().contains("signature"));
        assert!(ca.sign_request(&csr, &["bogus".to_string()], Duration::hours(1), now()).is_err());
    }
}
