//! The Python client's generated, typed API against our apiserver (`test/clients/`): each
//! verb's answer decodes as the type the API declares (a deleted Service comes back as a
//! `V1Service`, a deleted ConfigMap as a `Status`), and errors carry their Status.

use std::path::Path;
use std::process::Command;

use anyhow::{ensure, Result};
use e2e::ApiServer;

#[test]
fn typed_crud_decodes_every_answer() -> Result<()> {
    let Some(python) = e2e::python_clients() else { return Ok(()) };
    let api = ApiServer::start()?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/typed_crud.py");
    let out = Command::new(python).arg(script).arg(api.url()).output()?;
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    ensure!(out.status.success(), "typed_crud.py failed:\n{stdout}\n{stderr}");
    for want in ["ok delete service", "ok delete pvc", "ok delete configmap (Status)", "ok 404 body"] {
        ensure!(stdout.lines().any(|l| l == want), "{want:?} missing:\n{stdout}");
    }
    Ok(())
}
