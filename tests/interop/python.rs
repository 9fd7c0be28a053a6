//! The Python that runs `server.py`: a virtual environment the test makes for itself under
//! the target directory (`target/interop-venv`), with `requirements.txt` installed by its own
//! pip, so that the README's `cargo test --all-features` needs no `pip install` into the
//! system Python (which recent Debian and Ubuntu refuse: PEP 668, "externally managed").
//!
//! It needs `python3` with the `venv` module and its `ensurepip` (Debian and Ubuntu:
//! `apt-get install python3 python3-venv`) and, the first time, network access to PyPI.
//! A venv that already holds what `requirements.txt` says (a stamp file written after a
//! successful install keeps a copy of it) is reused as it is. Test binaries that run at the
//! same time (and other checkouts' `cargo test` on a shared target directory) take a lock
//! file around the check and the install, so one makes the venv and the others reuse it.
//!
//! `INTEROP_PYTHON` names an interpreter to use instead, as it is (no venv, no install).

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

/// The interpreter that makes the venv.
const BASE_PYTHON: &str = "python3";
/// Names an interpreter to use instead of the venv's.
pub(crate) const PYTHON_VAR: &str = "INTEROP_PYTHON";
const REQUIREMENTS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/interop/requirements.txt"
);
/// Written into the venv after a successful install: a copy of the requirements it holds.
const STAMP: &str = "interop-requirements.txt";

/// The interpreter to run `server.py` with, or why there is none (a message naming the
/// missing prerequisite). Made once per test binary; every test that needs it gets the same
/// answer.
pub(crate) fn interpreter() -> Result<PathBuf, String> {
    static PYTHON: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PYTHON
        .get_or_init(|| match std::env::var_os(PYTHON_VAR) {
            Some(python) => Ok(PathBuf::from(python)),
            None => venv_python(&venv_dir()),
        })
        .clone()
}

/// `target/interop-venv` (the parent of the target directory's `tmp`).
fn venv_dir() -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(tmp).join("interop-venv")
}

fn python_in(venv: &Path) -> PathBuf {
    venv.join("bin").join("python")
}

/// The venv's python, after making the venv if it is missing or out of date.
fn venv_python(venv: &Path) -> Result<PathBuf, String> {
    let requirements = fs::read_to_string(REQUIREMENTS)
        .map_err(|error| format!("cannot read {REQUIREMENTS}: {error}"))?;
    let python = python_in(venv);
    if is_ready(venv, &requirements) {
        return Ok(python);
    }

    let parent = venv.parent().unwrap_or(venv);
    fs::create_dir_all(parent)
        .map_err(|error| format!("cannot create {}: {error}", parent.display()))?;
    let lock_path = venv.with_extension("lock");
    let lock = File::create(&lock_path)
        .map_err(|error| format!("cannot create {}: {error}", lock_path.display()))?;
    // Released when `lock` is dropped, or when the process dies.
    lock.lock()
        .map_err(|error| format!("cannot lock {}: {error}", lock_path.display()))?;
    // Another process may have made it while this one waited for the lock.
    if is_ready(venv, &requirements) {
        return Ok(python);
    }

    eprintln!(
        "interop test: making a Python venv for the C-core server in {} ({BASE_PYTHON} -m venv, \
         then pip install -r tests/interop/requirements.txt)",
        venv.display()
    );
    // A venv without its stamp is one whose making stopped half way, or an older one.
    if venv.exists() {
        fs::remove_dir_all(venv)
            .map_err(|error| format!("cannot remove the old {}: {error}", venv.display()))?;
    }
    create_venv(venv)?;
    install(&python, venv)?;
    fs::write(venv.join(STAMP), &requirements)
        .map_err(|error| format!("cannot write {}: {error}", venv.join(STAMP).display()))?;
    drop(lock);
    Ok(python)
}

/// Whether `venv` holds `requirements`, installed by a make that ran to its end.
fn is_ready(venv: &Path, requirements: &str) -> bool {
    python_in(venv).exists()
        && fs::read_to_string(venv.join(STAMP)).is_ok_and(|stamp| stamp == requirements)
}

fn create_venv(venv: &Path) -> Result<(), String> {
    let output = Command::new(BASE_PYTHON)
        .arg("-m")
        .arg("venv")
        .arg(venv)
        .stdin(Stdio::null())
        .output();
    match output {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Err(format!(
            "{BASE_PYTHON} not found: install python3 and python3-venv (apt-get install python3 \
             python3-venv), set {PYTHON_VAR} to a Python with grpcio, or SKIP_INTEROP=1 to skip"
        )),
        Err(error) => Err(format!(
            "cannot run {BASE_PYTHON} ({error}): install python3 and python3-venv (apt-get \
             install python3 python3-venv)"
        )),
        Ok(output) if !output.status.success() => {
            // Leave no half-made venv behind for the next run to trust.
            let _ = fs::remove_dir_all(venv);
            Err(format!(
                "{BASE_PYTHON} -m venv {} failed ({}): install python3-venv (apt-get install \
                 python3-venv). It said:\n{}",
                venv.display(),
                output.status,
                said(&output)
            ))
        }
        Ok(_) => Ok(()),
    }
}

fn install(python: &Path, venv: &Path) -> Result<(), String> {
    let output = Command::new(python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .arg("-r")
        .arg(REQUIREMENTS)
        .stdin(Stdio::null())
        .output()
        .map_err(|error| format!("cannot run {} -m pip: {error}", python.display()))?;
    if output.status.success() {
        return Ok(());
    }
    let _ = fs::remove_dir_all(venv);
    Err(format!(
        "pip install of tests/interop/requirements.txt into {} failed ({}): it needs network \
         access to PyPI (or a mirror named by PIP_INDEX_URL); SKIP_INTEROP=1 skips the interop \
         tests. pip said:\n{}",
        venv.display(),
        output.status,
        said(&output)
    ))
}

/// What a command printed, stderr first, at most the last 4 KiB.
fn said(output: &Output) -> String {
    let mut text = String::from_utf8_lossy(&output.stderr).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stdout));
    let text = text.trim();
    let keep = 4096;
    match text.len().checked_sub(keep) {
        Some(cut) => {
            let cut = (cut..text.len())
                .find(|&i| text.is_char_boundary(i))
                .unwrap_or(0);
            format!("…{}", &text[cut..])
        }
        None => text.to_owned(),
    }
}

/// Makes (or reuses) the venv on its own, so that a set-up step (`.ci/run`) shows a missing
/// prerequisite or an unreachable PyPI as a set-up failure, before the test run.
#[test]
fn python_peer_is_installed() {
    if std::env::var("SKIP_INTEROP").is_ok_and(|v| v == "1") {
        eprintln!("SKIP_INTEROP=1: interop test skipped");
        return;
    }
    let python = interpreter().unwrap_or_else(|why| panic!("interop test: {why}"));
    let imported = Command::new(&python)
        .args(["-c", "import grpc; print(grpc.__version__)"])
        .output()
        .unwrap_or_else(|error| panic!("cannot run {}: {error}", python.display()));
    assert!(
        imported.status.success(),
        "{} cannot import grpc:\n{}",
        python.display(),
        said(&imported)
    );
    eprintln!(
        "interop test: {} has grpcio {}",
        python.display(),
        String::from_utf8_lossy(&imported.stdout).trim()
    );
}
