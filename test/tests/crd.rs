//! CustomResourceDefinitions with the official kubectl: a CRD is served at once (discovery,
//! routing), its resources are defaulted and validated from openAPIV3Schema, print their
//! additionalPrinterColumns, scale through the scale subresource, and go away with the CRD.

use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use e2e::{official_kubectls, ApiServer};

const CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: crontabs.stable.example.com
spec:
  group: stable.example.com
  scope: Namespaced
  names:
    plural: crontabs
    singular: crontab
    kind: CronTab
    shortNames: [ct]
  versions:
  - name: v1
    served: true
    storage: true
    subresources:
      status: {}
      scale:
        specReplicasPath: .spec.replicas
        statusReplicasPath: .status.replicas
    additionalPrinterColumns:
    - name: Spec
      type: string
      jsonPath: .spec.cronSpec
    - name: Replicas
      type: integer
      jsonPath: .spec.replicas
    - name: Age
      type: date
      jsonPath: .metadata.creationTimestamp
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [cronSpec]
            properties:
              cronSpec: {type: string}
              image: {type: string}
              replicas: {type: integer, default: 1}
              mode: {type: string, enum: [Fast, Slow]}
          status:
            type: object
            x-kubernetes-preserve-unknown-fields: true
"#;

const CLUSTER_CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: meshes.mesh.minik8s.io
spec:
  group: mesh.minik8s.io
  scope: Cluster
  names: {plural: meshes, singular: mesh, kind: Mesh}
  versions:
  - name: v1alpha1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
"#;

#[test]
fn crd_lifecycle_with_kubectl() -> Result<()> {
    for (v, bin) in official_kubectls(&["1.33", "1.27"]) {
        let server = ApiServer::start()?;
        let k = |args: &[&str]| server.kubectl_bin(&bin, args);
        let write = |name: &str, text: &str| -> Result<String> {
            let p = server.data_dir.join(name);
            std::fs::write(&p, text)?;
            Ok(p.to_string_lossy().into_owned())
        };
        let crd = write("crd.yaml", CRD)?;
        let out = k(&["apply", "-f", &crd])?;
        ensure!(out.ok, "kubectl {v} apply crd: {}", out.stderr);
        let out = k(&["wait", "--for=condition=established", "crd/crontabs.stable.example.com", "--timeout=20s"])?;
        ensure!(out.ok, "kubectl {v} wait: {out:?}");
        // Served within a second or so: discovery lists it.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let out = k(&["api-resources", "--api-group=stable.example.com"])?;
            if out.stdout.contains("crontabs") {
                ensure!(out.stdout.contains("ct") && out.stdout.contains("CronTab"), "{out:?}");
                break;
            }
            ensure!(Instant::now() < deadline, "kubectl {v}: CRD not in discovery: {out:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
        let cr = write(
            "ct.yaml",
            "apiVersion: stable.example.com/v1\nkind: CronTab\nmetadata:\n  name: my-cron\nspec:\n  cronSpec: \"* * * * */5\"\n  image: my-cron-image\n",
        )?;
        let out = k(&["apply", "-f", &cr])?;
        ensure!(out.ok && out.stdout.contains("crontab.stable.example.com/my-cron created"), "kubectl {v}: {out:?}");
        let out = k(&["apply", "-f", &cr])?;
        ensure!(out.ok && out.stdout.contains("unchanged"), "kubectl {v}: {out:?}");
        // Printer columns, defaulting.
        let out = k(&["get", "ct"])?;
        let header: Vec<&str> = out.stdout.lines().next().unwrap_or_default().split_whitespace().collect();
        ensure!(header == ["NAME", "SPEC", "REPLICAS", "AGE"], "kubectl {v}: {}", out.stdout);
        let row: Vec<&str> = out.stdout.lines().nth(1).unwrap_or_default().split_whitespace().collect();
        ensure!(row.first() == Some(&"my-cron") && row.contains(&"1"), "kubectl {v}: {}", out.stdout);
        ensure!(row.last().is_some_and(|a| a.ends_with('s')), "age column: {}", out.stdout);
        // Validation against the schema.
        let bad = write(
            "bad.yaml",
            "apiVersion: stable.example.com/v1\nkind: CronTab\nmetadata:\n  name: bad\nspec:\n  image: x\n  mode: Medium\n",
        )?;
        let out = k(&["apply", "-f", &bad])?;
        ensure!(!out.ok && out.stderr.contains("spec.cronSpec: Required value"), "kubectl {v}: {out:?}");
        ensure!(out.stderr.contains("spec.mode: Unsupported value: \"Medium\""), "kubectl {v}: {out:?}");
        // Unknown fields: pruned, and refused under kubectl's default strict validation.
        let unknown = write(
            "unknown.yaml",
            "apiVersion: stable.example.com/v1\nkind: CronTab\nmetadata:\n  name: u\nspec:\n  cronSpec: x\n  bogus: 1\n",
        )?;
        let out = k(&["apply", "-f", &unknown])?;
        ensure!(!out.ok && out.stderr.contains("unknown field \"spec.bogus\""), "kubectl {v}: {out:?}");
        // OpenAPI for the CRD: kubectl explain.
        let out = k(&["explain", "crontab.spec"])?;
        ensure!(out.ok && out.stdout.contains("cronSpec") && out.stdout.contains("-required-"), "kubectl {v}: {out:?}");
        // Scale subresource, status subresource.
        let out = k(&["scale", "ct", "my-cron", "--replicas=3"])?;
        ensure!(out.ok, "kubectl {v}: {out:?}");
        let out = k(&["get", "ct", "my-cron", "-o", "jsonpath={.spec.replicas}"])?;
        ensure!(out.stdout == "3", "kubectl {v}: {out:?}");
        // A cluster-scoped CRD preserving unknown fields.
        let mesh = write("mesh.yaml", CLUSTER_CRD)?;
        ensure!(k(&["apply", "-f", &mesh])?.ok);
        ensure!(k(&["wait", "--for=condition=established", "crd/meshes.mesh.minik8s.io", "--timeout=20s"])?.ok);
        let m = write(
            "m.yaml",
            "apiVersion: mesh.minik8s.io/v1alpha1\nkind: Mesh\nmetadata:\n  name: m1\nspec:\n  anything:\n    goes: [1, 2]\n",
        )?;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let out = k(&["apply", "-f", &m])?;
            if out.ok {
                break;
            }
            ensure!(Instant::now() < deadline, "kubectl {v}: {out:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
        let out = k(&["get", "mesh", "m1", "-o", "jsonpath={.spec.anything.goes}"])?;
        ensure!(out.stdout == "[1,2]", "kubectl {v}: {out:?}");
        // Deleting the CRD deletes its objects.
        let out = k(&["delete", "-f", &crd])?;
        ensure!(out.ok, "kubectl {v}: {out:?}");
        ensure!(k(&["apply", "-f", &crd])?.ok);
        ensure!(k(&["wait", "--for=condition=established", "crd/crontabs.stable.example.com", "--timeout=20s"])?.ok);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let out = k(&["get", "ct", "-o", "name"])?;
            if out.ok {
                ensure!(out.stdout.trim().is_empty(), "kubectl {v}: objects survived their CRD: {out:?}");
                break;
            }
            ensure!(Instant::now() < deadline, "kubectl {v}: {out:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}

const VERSIONED_CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, properties: {size: {type: integer}}}
          status: {type: object, properties: {ready: {type: boolean}}}
  - name: v1beta1
    served: true
    storage: false
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, properties: {size: {type: integer}}}
          status: {type: object, properties: {ready: {type: boolean}}}
"#;

/// A CRD with two served versions and no conversion webhook (`conversion: None`): an object
/// written through either version is stored as the storage version and read back as the
/// version asked for; a status patch through one version of an object created through the
/// other works (what a controller written against the newer version does).
#[test]
fn every_served_version_of_a_crd_reads_and_writes_the_same_objects() -> Result<()> {
    let server = ApiServer::start()?;
    let k = |args: &[&str]| server.kubectl(args);
    let p = server.data_dir.join("versioned.yaml");
    std::fs::write(&p, VERSIONED_CRD)?;
    ensure!(k(&["apply", "-f", &p.to_string_lossy()])?.ok);
    ensure!(k(&["wait", "--for=condition=established", "crd/widgets.example.com", "--timeout=20s"])?.ok);
    let w = server.data_dir.join("w.yaml");
    std::fs::write(&w, "apiVersion: example.com/v1beta1\nkind: Widget\nmetadata: {name: w1}\nspec: {size: 3}\n")?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !k(&["apply", "-f", &w.to_string_lossy()])?.ok {
        ensure!(Instant::now() < deadline, "the v1beta1 Widget was never created");
        std::thread::sleep(Duration::from_millis(100));
    }
    for (resource, want) in
        [("widgets.v1.example.com", "example.com/v1"), ("widgets.v1beta1.example.com", "example.com/v1beta1")]
    {
        let out = k(&["get", resource, "w1", "-o", "jsonpath={.apiVersion} {.spec.size}"])?;
        ensure!(out.stdout == format!("{want} 3"), "get {resource}: {out:?}");
    }
    let listed = k(&["get", "widgets.v1.example.com", "-o", "jsonpath={.items[*].apiVersion}"])?;
    ensure!(listed.stdout == "example.com/v1", "{listed:?}");
    let patched = k(&[
        "patch",
        "widgets.v1.example.com",
        "w1",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"ready":true}}"#,
    ])?;
    ensure!(patched.ok, "status patch through v1: {patched:?}");
    let out = k(&["get", "widgets.v1beta1.example.com", "w1", "-o", "jsonpath={.apiVersion} {.status.ready}"])?;
    ensure!(out.stdout == "example.com/v1beta1 true", "{out:?}");
    let updated = k(&["patch", "widgets.v1beta1.example.com", "w1", "--type=merge", "-p", r#"{"spec":{"size":5}}"#])?;
    ensure!(updated.ok, "{updated:?}");
    let out = k(&["get", "widgets.v1.example.com", "w1", "-o", "jsonpath={.apiVersion} {.spec.size}"])?;
    ensure!(out.stdout == "example.com/v1 5", "{out:?}");

    // Our kubectl maps a manifest of a version that is not the preferred one, and reads
    // through it.
    let ours = e2e::kubectl::our_kubectl();
    let w2 = "apiVersion: example.com/v1beta1\nkind: Widget\nmetadata: {name: w2}\nspec: {size: 7}\n";
    let out = e2e::kubectl::run(&ours, &server.url(), &["apply", "-f", "-"], Some(w2))?;
    ensure!(out.code == 0 && out.stdout.contains("widget.example.com/w2 created"), "{out:?}");
    let out = e2e::kubectl::run(
        &ours,
        &server.url(),
        &["get", "widgets.v1beta1.example.com", "w2", "-o", "jsonpath={.apiVersion} {.spec.size}"],
        None,
    )?;
    ensure!(out.stdout == "example.com/v1beta1 7", "{out:?}");
    Ok(())
}

const LIMITED_CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: pools.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: pools, singular: pool, kind: Pool}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            x-kubernetes-validations:
            - rule: self.replicas <= self.maxReplicas
              messageExpression: "'replicas (' + string(self.replicas) + ') above maxReplicas'"
            - rule: self.maxReplicas >= oldSelf.maxReplicas
              message: maxReplicas may not shrink
            - rule: "!has(self.owner) || self.owner.startsWith('team-')"
              fieldPath: .owner
              reason: FieldValueForbidden
            properties:
              replicas: {type: integer, minimum: 1, maximum: 10}
              maxReplicas: {type: integer}
              owner: {type: string}
              name: {type: string, minLength: 2, maxLength: 8, pattern: '^[a-z]+$'}
              contact: {type: string, format: email}
              zones: {type: array, maxItems: 2, x-kubernetes-list-type: set, items: {type: string}}
"#;

/// A CRD's schema limits (ranges, lengths, patterns, formats, item counts, set lists) and
/// its CEL rules (`x-kubernetes-validations`: message, messageExpression, reason, fieldPath,
/// a transition rule on `oldSelf`), seen as a kubectl user sees them: the apiserver's
/// `Invalid` answer, worded as Kubernetes words it; a CRD whose rule does not compile is
/// refused.
#[test]
fn custom_resources_meet_their_schema_limits_and_cel_rules() -> Result<()> {
    for (v, bin) in official_kubectls(&["1.33"]) {
        let server = ApiServer::start()?;
        let apply = |name: &str, text: &str| -> Result<e2e::KubectlOutput> {
            let p = server.data_dir.join(name);
            std::fs::write(&p, text)?;
            server.kubectl_bin(&bin, &["apply", "-f", &p.to_string_lossy()])
        };
        let broken = LIMITED_CRD.replace("self.replicas <= self.maxReplicas", "self.replicas <=");
        let out = apply("broken.yaml", &broken)?;
        ensure!(
            !out.ok
                && out.stderr.contains(
                    "spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule: Invalid value"
                )
                && out.stderr.contains("compilation failed"),
            "kubectl {v}: a rule that does not compile: {out:?}"
        );
        ensure!(apply("crd.yaml", LIMITED_CRD)?.ok, "kubectl {v}: the CRD");
        ensure!(server.kubectl_bin(&bin, &["wait", "--for=condition=established", "crd/pools.example.com"])?.ok);
        let pool =
            |spec: &str| format!("apiVersion: example.com/v1\nkind: Pool\nmetadata: {{name: p}}\nspec: {spec}\n");
        let bad = "{replicas: 12, maxReplicas: 5, owner: ops, name: Pool1, contact: nobody, zones: [a, b, a]}";
        let deadline = Instant::now() + Duration::from_secs(5);
        let out = loop {
            let out = apply("bad.yaml", &pool(bad))?;
            if !out.stderr.contains("the server could not find") || Instant::now() > deadline {
                break out;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        ensure!(!out.ok, "kubectl {v}: an invalid Pool was accepted: {out:?}");
        for want in [
            "spec.replicas: Invalid value: 12: spec.replicas in body should be less than or equal to 10",
            "spec.name: Invalid value: \"Pool1\": spec.name in body should match '^[a-z]+$'",
            "spec.contact: Invalid value: \"nobody\": spec.contact in body must be of type email: \"nobody\"",
            "spec.zones: Too many: 3: must have at most 2 items",
            "spec.zones[2]: Duplicate value: \"a\"",
            "spec: Invalid value: \"object\": replicas (12) above maxReplicas",
            "spec.owner: Forbidden: failed rule: !has(self.owner) || self.owner.startsWith('team-')",
        ] {
            ensure!(out.stderr.contains(want), "kubectl {v}: missing {want:?} in {}", out.stderr);
        }
        ensure!(!out.stderr.contains("may not shrink"), "kubectl {v}: a transition rule ran on create: {}", out.stderr);
        let out = apply("good.yaml", &pool("{replicas: 2, maxReplicas: 5, owner: team-a, name: pool, zones: [a]}"))?;
        ensure!(out.ok, "kubectl {v}: a valid Pool: {out:?}");
        let out = apply("shrunk.yaml", &pool("{replicas: 2, maxReplicas: 4, owner: team-a, name: pool, zones: [a]}"))?;
        ensure!(
            !out.ok && out.stderr.contains("spec: Invalid value: \"object\": maxReplicas may not shrink"),
            "kubectl {v}: the transition rule: {out:?}"
        );
        let out = apply("grown.yaml", &pool("{replicas: 6, maxReplicas: 8, owner: team-a, name: pool, zones: [a]}"))?;
        ensure!(out.ok, "kubectl {v}: growing: {out:?}");
    }
    Ok(())
}
