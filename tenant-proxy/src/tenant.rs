//! Who a tenant is and how its names are stored upstream; pure.
//!
//! Tenant `acme`'s namespace `prod` is stored as `acme-prod`, its cluster-scoped objects'
//! names get the same prefix (ClusterRole `reader` → `acme-reader`), the groups of its
//! CustomResourceDefinitions a `acme.` in front (`example.com` → `acme.example.com`), and its
//! users and groups a `tenant:acme:` (user `jane` → `tenant:acme:jane`), which no other
//! authenticator hands out. A tenant name has no `-`, so a stored name belongs to at most one
//! tenant: with `a-b` allowed, tenant `a-b`'s `c` and tenant `a`'s `b-c` would both be `a-b-c`.

use std::fmt;

/// The certificate organization (O) naming the tenant: `tenant:<name>`.
pub const ORG_PREFIX: &str = "tenant:";
/// The longest tenant name: what is left of a 63-character name after it stays useful.
pub const MAX_NAME: usize = 10;
/// Kubernetes' superuser group: inside a tenant, the tenant's own administrators.
pub const MASTERS: &str = "system:masters";

/// A tenant; its name is valid by construction.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Tenant {
    name: String,
}

/// Why a tenant name is not one.
pub fn validate_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(format!("a tenant name has 1 to {MAX_NAME} characters, not {}", name.len()));
    }
    if !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) || !name.as_bytes()[0].is_ascii_lowercase() {
        return Err(format!(
            "tenant name {name:?}: lowercase letters and digits, starting with a letter ('-' would make two tenants' stored names collide)"
        ));
    }
    Ok(())
}

impl Tenant {
    pub fn new(name: &str) -> Result<Tenant, String> {
        validate_name(name)?;
        Ok(Tenant { name: name.to_string() })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The prefix of its stored namespaces and cluster-scoped names: `acme-`.
    pub fn prefix(&self) -> String {
        format!("{}-", self.name)
    }

    /// A namespace or cluster-scoped name as stored upstream.
    pub fn up(&self, name: &str) -> String {
        format!("{}-{name}", self.name)
    }

    /// A stored name as the tenant knows it; None if it is not the tenant's.
    pub fn down<'a>(&self, stored: &'a str) -> Option<&'a str> {
        stored.strip_prefix(&self.name)?.strip_prefix('-')
    }

    /// A stored name as the tenant sees it: its own without the prefix, a shared one as is.
    pub fn down_or_same<'a>(&self, stored: &'a str) -> &'a str {
        self.down(stored).unwrap_or(stored)
    }

    /// An API group as stored upstream: Kubernetes' own groups as they are, any other (a
    /// CustomResourceDefinition's) under the tenant's prefix.
    pub fn group_up(&self, group: &str) -> String {
        if is_builtin_group(group) {
            group.to_string()
        } else {
            format!("{}.{group}", self.name)
        }
    }

    /// An upstream group as the tenant sees it; None if the tenant must not see it (another
    /// tenant's CRDs, the cluster administrator's).
    pub fn group_down<'a>(&self, group: &'a str) -> Option<&'a str> {
        if is_builtin_group(group) {
            return Some(group);
        }
        group.strip_prefix(&self.name)?.strip_prefix('.')
    }

    /// `group/version` (or `v1`) as stored upstream.
    pub fn api_version_up(&self, api_version: &str) -> String {
        match api_version.split_once('/') {
            Some((g, v)) => format!("{}/{v}", self.group_up(g)),
            None => api_version.to_string(),
        }
    }

    pub fn api_version_down(&self, api_version: &str) -> Option<String> {
        match api_version.split_once('/') {
            Some((g, v)) => Some(format!("{}/{v}", self.group_down(g)?)),
            None => Some(api_version.to_string()),
        }
    }

    /// A user or group of the tenant as the upstream authorizer knows it.
    pub fn subject_up(&self, name: &str) -> String {
        format!("{ORG_PREFIX}{}:{name}", self.name)
    }

    pub fn subject_down<'a>(&self, stored: &'a str) -> Option<&'a str> {
        stored.strip_prefix(ORG_PREFIX)?.strip_prefix(&self.name)?.strip_prefix(':')
    }

    /// A CustomResourceDefinition's name (`<plural>.<group>`) as stored upstream.
    pub fn crd_name_up(&self, name: &str) -> String {
        match name.split_once('.') {
            Some((plural, group)) => format!("{plural}.{}", self.group_up(group)),
            None => name.to_string(),
        }
    }

    pub fn crd_name_down(&self, stored: &str) -> Option<String> {
        let (plural, group) = stored.split_once('.')?;
        Some(format!("{plural}.{}", self.group_down(group)?))
    }
}

impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// Kubernetes' own API groups: the core group, those without a dot (`apps`, `batch`,
/// `autoscaling`, `policy`) and `*.k8s.io` (which a CustomResourceDefinition may only use
/// with Kubernetes' approval). Every other group is a CRD's, and a tenant's CRDs are its own.
pub fn is_builtin_group(group: &str) -> bool {
    !group.contains('.') || group == "k8s.io" || group.ends_with(".k8s.io")
}

/// Who is calling: the tenant, the user and the groups inside it, from the client
/// certificate (CN = user; O = `tenant:<name>` and the user's groups).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub tenant: Tenant,
    pub user: String,
    pub groups: Vec<String>,
}

impl Caller {
    /// The caller of a verified certificate's subject, or why it names none (no
    /// `O=tenant:<name>`, an invalid one, no user).
    pub fn from_subject(common_name: &str, organizations: &[String]) -> Result<Caller, String> {
        let mut tenants = organizations.iter().filter_map(|o| o.strip_prefix(ORG_PREFIX));
        let name = tenants.next().ok_or_else(|| {
            format!(
                "the client certificate of {common_name:?} names no tenant: the tenant proxy needs an organization (O) {ORG_PREFIX}<tenant>"
            )
        })?;
        if tenants.next().is_some() {
            return Err(format!("the client certificate of {common_name:?} names more than one tenant"));
        }
        let tenant = Tenant::new(name)?;
        if common_name.is_empty() {
            return Err("the client certificate has no user name (CN)".into());
        }
        let groups = organizations.iter().filter(|o| !o.starts_with(ORG_PREFIX)).cloned().collect();
        Ok(Caller { tenant, user: common_name.to_string(), groups })
    }

    /// The tenant's administrators (its `system:masters`) act with the proxy's own rights,
    /// every request kept inside the tenant by the conversion; everyone else is impersonated.
    pub fn is_admin(&self) -> bool {
        self.groups.iter().any(|g| g == MASTERS)
    }

    /// The `Impersonate-User` and `Impersonate-Group` values the apiserver authorizes.
    pub fn impersonation(&self) -> (String, Vec<String>) {
        let mut groups: Vec<String> = self.groups.iter().map(|g| self.tenant.subject_up(g)).collect();
        groups.push(self.tenant.subject_up("system:authenticated"));
        (self.tenant.subject_up(&self.user), groups)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_stay_in_their_tenant() {
        let t = Tenant::new("acme").unwrap();
        assert_eq!(t.up("prod"), "acme-prod");
        assert_eq!(t.down("acme-prod"), Some("prod"));
        assert_eq!(t.down("acmex-prod"), None);
        assert_eq!(t.down("other-prod"), None);
        assert_eq!(t.down_or_same("standard"), "standard");
        assert_eq!(t.group_up("example.com"), "acme.example.com");
        assert_eq!(t.group_up("apps"), "apps");
        assert_eq!(t.group_up("rbac.authorization.k8s.io"), "rbac.authorization.k8s.io");
        assert_eq!(t.group_down("acme.example.com"), Some("example.com"));
        assert_eq!(t.group_down("other.example.com"), None);
        assert_eq!(t.group_down("networking.istio.io"), None);
        assert_eq!(t.api_version_up("example.com/v1"), "acme.example.com/v1");
        assert_eq!(t.api_version_down("acme.example.com/v1").as_deref(), Some("example.com/v1"));
        assert_eq!(t.api_version_down("v1").as_deref(), Some("v1"));
        assert_eq!(t.crd_name_up("widgets.example.com"), "widgets.acme.example.com");
        assert_eq!(t.crd_name_down("widgets.acme.example.com").as_deref(), Some("widgets.example.com"));
        assert_eq!(t.crd_name_down("widgets.b.example.com"), None);
        assert_eq!(t.subject_up("jane"), "tenant:acme:jane");
        assert_eq!(t.subject_down("tenant:acme:jane"), Some("jane"));
        assert_eq!(t.subject_down("tenant:acmex:jane"), None);
    }

    #[test]
    fn tenant_names_are_short_and_have_no_dash() {
        assert!(Tenant::new("a1").is_ok());
        assert!(Tenant::new("abcdefghij").is_ok());
        assert!(Tenant::new("abcdefghijk").unwrap_err().contains("1 to 10"));
        assert!(Tenant::new("a-b").unwrap_err().contains("collide"));
        assert!(Tenant::new("1a").is_err());
        assert!(Tenant::new("").is_err());
        assert!(Tenant::new("Acme").is_err());
    }

    #[test]
    fn callers_come_from_certificate_subjects() {
        let c = Caller::from_subject("jane", &["tenant:acme".into(), "devs".into()]).unwrap();
        assert_eq!(c.tenant.name(), "acme");
        assert_eq!(c.groups, vec!["devs"]);
        assert!(!c.is_admin());
        assert_eq!(
            c.impersonation(),
            ("tenant:acme:jane".into(), vec!["tenant:acme:devs".into(), "tenant:acme:system:authenticated".into()])
        );
        let admin = Caller::from_subject("admin", &["tenant:acme".into(), "system:masters".into()]).unwrap();
        assert!(admin.is_admin());
        assert!(Caller::from_subject("jane", &["devs".into()]).unwrap_err().contains("names no tenant"));
        assert!(Caller::from_subject("jane", &["tenant:a".into(), "tenant:b".into()]).is_err());
        assert!(Caller::from_subject("jane", &["tenant:a-b".into()]).is_err());
    }
}
