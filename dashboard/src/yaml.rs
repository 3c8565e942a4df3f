//! Objects as YAML, and where the apiserver's field errors are in YAML a person edited.
//!
//! The YAML tab shows an object as `kubectl get -o yaml` does (keys sorted, managedFields
//! left out); its editor sends the text back, and when the apiserver refuses it with field
//! causes (`spec.replicas`, `spec.template.spec.containers[0].image`) the page shows each
//! message beside the line of the text where that field is. [`field_lines`] finds those
//! lines from the parser's events (a real YAML parser: flow style, comments and quoting are
//! its business, not ours).

use std::collections::HashMap;

use serde_json::Value;
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

/// The object as `kubectl get -o yaml` prints it: managedFields are left out (kubectl's
/// default since 1.21).
pub fn to_yaml(mut object: Value) -> String {
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    serde_yaml::to_string(&object).unwrap_or_default()
}

/// A YAML document that does not parse: the message and its 1-based line.
#[derive(Debug, PartialEq)]
pub struct SyntaxError {
    pub line: usize,
    pub message: String,
}

/// The edited text as the JSON object to send.
pub fn parse(text: &str) -> Result<Value, SyntaxError> {
    match serde_yaml::from_str::<Value>(text) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err(SyntaxError { line: 1, message: "the document must be one object (a mapping)".into() }),
        Err(e) => Err(SyntaxError { line: e.location().map_or(1, |l| l.line()), message: e.to_string() }),
    }
}

/// One step of a field path: a mapping key or a list index.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Step {
    Key(String),
    Index(usize),
}

/// A Kubernetes field path (`spec.containers[0].image`, `metadata.labels[app]`) as steps;
/// a bracketed number is an index, other bracketed text a map key.
fn steps(path: &str) -> Vec<Step> {
    let mut out = Vec::new();
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']').unwrap_or(r.len());
            let inner = &r[..end];
            out.push(inner.parse::<usize>().map(Step::Index).unwrap_or_else(|_| Step::Key(inner.to_string())));
            rest = r.get(end + 1..).unwrap_or("");
        } else {
            let r = rest.strip_prefix('.').unwrap_or(rest);
            let end = r.find(['.', '[']).unwrap_or(r.len());
            if end > 0 {
                out.push(Step::Key(r[..end].to_string()));
            }
            rest = &r[end..];
        }
    }
    out
}

enum Frame {
    /// A mapping: the key being read or whose value comes next.
    Map { key: Option<String> },
    /// A sequence: the index of the next item.
    Seq { next: usize },
}

/// The parser's events → the line of every path in the first document.
#[derive(Default)]
struct Lines {
    stack: Vec<Frame>,
    lines: HashMap<Vec<Step>, usize>,
    done: bool,
}

impl Lines {
    fn path(&self) -> Vec<Step> {
        let mut out = Vec::new();
        for f in &self.stack {
            match f {
                Frame::Map { key: Some(k) } => out.push(Step::Key(k.clone())),
                Frame::Seq { next } => out.push(Step::Index(next.saturating_sub(1))),
                Frame::Map { key: None } => {}
            }
        }
        out
    }

    /// A node starts (a scalar, mapping or sequence) at `line`: as a key of the enclosing
    /// mapping (`Some(key text)` returned: remember it) or as a value.
    fn node(&mut self, scalar: Option<&str>, line: usize) -> bool {
        match self.stack.last_mut() {
            Some(Frame::Map { key }) if key.is_none() => {
                *key = Some(scalar.unwrap_or_default().to_string());
                let path = self.path();
                self.lines.entry(path).or_insert(line);
                true
            }
            Some(Frame::Seq { next }) => {
                *next += 1;
                let path = self.path();
                self.lines.entry(path).or_insert(line);
                false
            }
            _ => false,
        }
    }

    /// A scalar or alias: a key, or a whole value.
    fn leaf(&mut self, scalar: Option<&str>, line: usize) {
        if !self.node(scalar, line) {
            self.value_done();
        }
    }

    /// A value ended: the enclosing mapping expects its next key.
    fn value_done(&mut self) {
        if let Some(Frame::Map { key }) = self.stack.last_mut() {
            *key = None;
        }
    }
}

impl MarkedEventReceiver for Lines {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        if self.done {
            return;
        }
        let line = mark.line();
        match ev {
            Event::Scalar(text, ..) => self.leaf(Some(&text), line),
            Event::Alias(_) => self.leaf(None, line),
            Event::MappingStart(..) => {
                self.node(None, line);
                self.stack.push(Frame::Map { key: None });
            }
            Event::SequenceStart(..) => {
                self.node(None, line);
                self.stack.push(Frame::Seq { next: 0 });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                self.stack.pop();
                self.value_done();
            }
            Event::DocumentEnd => self.done = true,
            _ => {}
        }
    }
}

/// The 1-based line of `field` (a Kubernetes field path) in `text`, or of its nearest
/// ancestor that is there (a missing required field points at its parent); `None` when
/// not even the first step is there or the text does not parse.
#[cfg(test)]
fn field_line(text: &str, field: &str) -> Option<usize> {
    field_lines(text, &[field]).pop().flatten()
}

/// [`field_line`] for several fields, parsing the text once.
pub fn field_lines(text: &str, fields: &[&str]) -> Vec<Option<usize>> {
    let mut lines = Lines::default();
    let parsed = Parser::new_from_str(text).load(&mut lines, false);
    fields
        .iter()
        .map(|field| {
            parsed.as_ref().ok()?;
            let mut path = steps(field);
            while !path.is_empty() {
                if let Some(line) = lines.lines.get(&path) {
                    return Some(*line);
                }
                path.pop();
            }
            None
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DEPLOYMENT: &str = "\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels:
    app: web
    tier: \"front\"
spec:
  replicas: -1   # a comment
  template:
    spec:
      containers:
      - name: main
        image: busybox
        ports: [{containerPort: 80}, {containerPort: 81}]
      - name: side
        image: ''
";

    #[test]
    fn paths_as_kubernetes_writes_them() {
        assert_eq!(
            steps("spec.template.spec.containers[1].image"),
            vec![
                Step::Key("spec".into()),
                Step::Key("template".into()),
                Step::Key("spec".into()),
                Step::Key("containers".into()),
                Step::Index(1),
                Step::Key("image".into())
            ]
        );
        assert_eq!(
            steps("metadata.labels[app.kubernetes.io/name]"),
            vec![Step::Key("metadata".into()), Step::Key("labels".into()), Step::Key("app.kubernetes.io/name".into())]
        );
        assert_eq!(steps(""), vec![]);
    }

    #[test]
    fn fields_are_found_on_their_lines() {
        let f = |p| field_line(DEPLOYMENT, p);
        assert_eq!(f("spec.replicas"), Some(9));
        assert_eq!(f("metadata.labels[tier]"), Some(7));
        assert_eq!(f("metadata.labels.app"), Some(6));
        assert_eq!(f("spec.template.spec.containers[0].name"), Some(13));
        assert_eq!(f("spec.template.spec.containers[1].image"), Some(17));
        assert_eq!(f("spec.template.spec.containers[1]"), Some(16));
        // flow style
        assert_eq!(f("spec.template.spec.containers[0].ports[1].containerPort"), Some(15));
        // missing: the nearest ancestor that is there
        assert_eq!(f("spec.template.spec.containers[0].resources.limits"), Some(13));
        assert_eq!(f("spec.selector"), Some(8));
        assert_eq!(f("status.replicas"), None);
        assert_eq!(field_line("a: [", "a"), None);
    }

    #[test]
    fn yaml_as_kubectl_prints_it_and_bad_yaml_names_its_line() {
        let obj = json!({"kind": "ConfigMap", "apiVersion": "v1",
            "metadata": {"name": "x", "managedFields": [{"manager": "kubectl"}]}, "data": {"b": "2", "a": "1"}});
        assert_eq!(to_yaml(obj), "apiVersion: v1\ndata:\n  a: '1'\n  b: '2'\nkind: ConfigMap\nmetadata:\n  name: x\n");
        let e = parse("a: 1\nb: [\n").unwrap_err();
        assert_eq!(e.line, 3, "{e:?}");
        assert_eq!(parse("- 1\n").unwrap_err().message, "the document must be one object (a mapping)");
        assert_eq!(parse("kind: Pod\n").unwrap(), json!({"kind": "Pod"}));
    }
}
