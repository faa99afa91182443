//! What the build and the tests need from the machine, found or installed
//! before cargo starts. The build: a C++ compiler and libclang (the
//! `rocksdb` crate compiles RocksDB's bundled C++ and generates its bindings
//! with bindgen, which loads libclang). The tests: Python 3 with moto's S3
//! server, so that the S3 test cases run against a real S3 API;
//! Chromium, which renders the web page headless so that its test checks
//! the DOM the page's script builds, not just the HTML served; and Flink's
//! own command line (PyPI's `apache-flink`, on a Java runtime), which a
//! test points at the REST API as a Flink user would; and PostgreSQL's
//! server programs, which the PostgreSQL sink's tests run.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The moto release the S3 tests are known to pass against.
pub const MOTO: &str = "moto[server]==5.2.1";

/// The Flink release whose command line the REST tests drive: its Python
/// package carries `bin/flink` and the jars it runs.
const FLINK: [&str; 2] = ["apache-flink==2.3.0", "apache-flink-libraries==2.3.0"];

/// Where `cargo xtask test` installs Flink's command line: beside the
/// build, which clones share, since it is 350 MB.
pub fn flink_cli() -> PathBuf {
    crate::target_dir().join("flink-2.3.0/pyflink/bin/flink")
}

/// What the machine is being prepared for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    Build,
    Test,
}

/// One thing the machine lacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Missing {
    CxxCompiler,
    Libclang,
    Python,
    Pip,
    Moto,
    Chromium,
    Java,
    FlinkCli,
    Postgres,
    ZooKeeper,
}

impl Missing {
    fn describe(self) -> &'static str {
        match self {
            Missing::CxxCompiler => "a C++ compiler (RocksDB's bundled C++)",
            Missing::Libclang => "libclang with its headers (bindgen generates RocksDB's bindings)",
            Missing::Python => "Python 3 (moto, the local S3 server of the tests)",
            Missing::Pip => "pip for Python 3 (installs moto)",
            Missing::Moto => "moto's S3 server, from PyPI",
            Missing::Chromium => "Chromium (the web page's test renders it headless)",
            Missing::Java => "a Java runtime (Flink's own command line, which a REST test drives)",
            Missing::FlinkCli => "Flink's command line, from PyPI (a REST test drives it)",
            Missing::Postgres => "PostgreSQL's server (the PostgreSQL sink's tests run one)",
            Missing::ZooKeeper => "ZooKeeper's server (the leader election's tests run one)",
        }
    }

    /// Debian's packages that provide it; moto and Flink come from PyPI
    /// instead.
    fn debian_packages(self) -> &'static [&'static str] {
        match self {
            Missing::CxxCompiler => &["g++"],
            Missing::Libclang => &["libclang-dev"],
            Missing::Python => &["python3", "python3-pip"],
            Missing::Pip => &["python3-pip"],
            Missing::Moto | Missing::FlinkCli => &[],
            Missing::Chromium => &["chromium"],
            Missing::Java => &["default-jre-headless"],
            Missing::Postgres => &["postgresql"],
            Missing::ZooKeeper => &["zookeeper"],
        }
    }
}

/// Makes sure the machine has what `purpose` needs, installing what it
/// can; fails naming what is still missing and how to install it.
pub fn ensure(purpose: Purpose) -> Result<(), String> {
    let missing = find_missing(purpose);
    if missing.is_empty() {
        return Ok(());
    }
    let packages: Vec<&str> = missing
        .iter()
        .flat_map(|m| m.debian_packages())
        .copied()
        .collect();
    if !packages.is_empty() {
        install_debian(&packages, &missing)?;
    }
    if find_missing(purpose).contains(&Missing::Moto) {
        pip_install(&[MOTO], &[], "the S3 tests' server")?;
    }
    if find_missing(purpose).contains(&Missing::FlinkCli) {
        let target = flink_cli();
        let target = target.ancestors().nth(3).expect("…/pyflink/bin/flink");
        let target = format!("--target={}", target.display());
        let platform = format!("--platform=manylinux2014_{}", std::env::consts::ARCH);
        // The command line runs no Python and needs none of PyFlink's
        // dependencies; its wheels stop at CPython 3.12, so that one is
        // asked for whatever Python runs pip.
        let options = [
            "--no-deps",
            "--only-binary=:all:",
            "--python-version=3.12",
            "--implementation=cp",
            "--abi=cp312",
            &platform,
            "--upgrade",
            &target,
        ];
        pip_install(&FLINK, &options, "Flink's command line")?;
    }
    match find_missing(purpose).as_slice() {
        [] => Ok(()),
        still => Err(format!("still missing after installing: {}", list(still))),
    }
}

fn find_missing(purpose: Purpose) -> Vec<Missing> {
    let mut missing = Vec::new();
    if !has_cxx_compiler() {
        missing.push(Missing::CxxCompiler);
    }
    if !has_libclang() {
        missing.push(Missing::Libclang);
    }
    if purpose == Purpose::Test {
        if !succeeds(Command::new(python()).arg("--version")) {
            missing.push(Missing::Python);
        } else if !succeeds(
            Command::new(python()).args(["-c", "import moto.server, flask, flask_cors"]),
        ) {
            if succeeds(Command::new(python()).args(["-m", "pip", "--version"])) {
                missing.push(Missing::Moto);
            } else {
                missing.extend([Missing::Pip, Missing::Moto]);
            }
        }
        if !has_chromium() {
            missing.push(Missing::Chromium);
        }
        if !succeeds(Command::new("java").arg("-version")) {
            missing.push(Missing::Java);
        }
        if crate::postgres::bin_dir().is_none() {
            missing.push(Missing::Postgres);
        }
        if crate::zookeeper::classpath().is_none() {
            missing.push(Missing::ZooKeeper);
        }
        if !flink_cli().is_file() {
            if !missing.contains(&Missing::Pip)
                && !succeeds(Command::new(python()).args(["-m", "pip", "--version"]))
            {
                missing.push(Missing::Pip);
            }
            missing.push(Missing::FlinkCli);
        }
    }
    missing
}

fn list(missing: &[Missing]) -> String {
    missing
        .iter()
        .map(|m| m.describe())
        .collect::<Vec<_>>()
        .join("; ")
}

/// The Python that runs moto: `PYTHON` if set.
pub fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

fn succeeds(command: &mut Command) -> bool {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether Chromium runs: Debian's `/usr/bin/chromium`, else `chromium`
/// on `PATH`.
fn has_chromium() -> bool {
    ["/usr/bin/chromium", "chromium"]
        .iter()
        .any(|chromium| succeeds(Command::new(chromium).arg("--version")))
}

/// The compiler the `cc` crate will use: `CXX`, else `c++`.
fn has_cxx_compiler() -> bool {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    succeeds(Command::new(cxx).arg("--version"))
}

/// Whether bindgen will find libclang: `LIBCLANG_PATH`, `llvm-config
/// --libdir`, or the system's library directories (those clang-sys
/// searches). A directory counts only with the unversioned `libclang.so`
/// or `libclang-N.so` that a development package installs, which comes
/// with clang's headers; a bare runtime `libclang.so.1` does not.
fn has_libclang() -> bool {
    if std::env::var_os("LIBCLANG_PATH").is_some() {
        return true;
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Ok(out) = Command::new("llvm-config")
        .arg("--libdir")
        .stderr(Stdio::null())
        .output()
    {
        dirs.push(String::from_utf8_lossy(&out.stdout).trim().into());
    }
    for root in ["/usr/lib", "/usr/lib64", "/usr/local/lib"] {
        let below = subdirs(Path::new(root));
        let llvm_libs = below
            .iter()
            .filter(|d| {
                d.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("llvm"))
            })
            .map(|d| d.join("lib"))
            .collect::<Vec<_>>();
        dirs.push(root.into());
        dirs.extend(below);
        dirs.extend(llvm_libs);
    }
    dirs.iter().any(|dir| {
        std::fs::read_dir(dir).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| is_libclang_dev(&e.file_name().to_string_lossy()))
        })
    })
}

fn subdirs(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default()
}

/// `libclang.so` or `libclang-14.so`, not `libclang.so.1` nor
/// `libclang-cpp.so`.
fn is_libclang_dev(name: &str) -> bool {
    name == "libclang.so"
        || name
            .strip_prefix("libclang-")
            .and_then(|rest| rest.strip_suffix(".so"))
            .is_some_and(|version| {
                !version.is_empty() && version.chars().all(|c| c.is_ascii_digit() || c == '.')
            })
}

/// Installs `packages` with apt-get as root, or through sudo when it needs
/// no password; otherwise says what to run.
fn install_debian(packages: &[&str], missing: &[Missing]) -> Result<(), String> {
    let install = format!(
        "apt-get update && apt-get install -y --no-install-recommends {}",
        packages.join(" ")
    );
    let refuse = |why: &str| {
        format!(
            "this machine lacks {}. {why} Install it, then run the command again:\n\n    sudo sh -c '{install}'\n\n(or, elsewhere than Debian or Ubuntu, your system's packages for a C++ compiler, libclang, Python 3 with pip, Chromium, a Java runtime, PostgreSQL's and ZooKeeper's servers (ZOOKEEPER_CLASSPATH naming ZooKeeper's classpath), PG_BIN naming its programs' directory if initdb is not on PATH; LIBCLANG_PATH names libclang's directory if it is not a system one)",
            list(missing)
        )
    };
    if !succeeds(Command::new("apt-get").arg("--version")) {
        return Err(refuse("This is not a Debian-like system (no apt-get)."));
    }
    let root = is_root();
    let sudo = !root && succeeds(Command::new("sudo").args(["-n", "true"]));
    if !root && !sudo {
        return Err(refuse("Installing it needs root."));
    }
    eprintln!(
        "cargo xtask: installing {} (for {})",
        packages.join(" "),
        list(missing)
    );
    for args in [
        vec!["update", "-qq"],
        [
            &["install", "-y", "-qq", "--no-install-recommends"][..],
            packages,
        ]
        .concat(),
    ] {
        let mut command = if sudo {
            let mut c = Command::new("sudo");
            c.args(["-n", "env", "DEBIAN_FRONTEND=noninteractive", "apt-get"]);
            c
        } else {
            let mut c = Command::new("apt-get");
            c.env("DEBIAN_FRONTEND", "noninteractive");
            c
        };
        command
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let status = command
            .status()
            .map_err(|e| format!("cannot run apt-get: {e}"))?;
        if !status.success() {
            return Err(format!("apt-get {} failed ({status})", args.join(" ")));
        }
    }
    Ok(())
}

/// Whether this runs as root.
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.trim_ascii() == b"0")
}

/// Makes sure cargo has `fmt` and `clippy`, which the test command's
/// checks run: rustup's minimal profile has neither.
pub fn ensure_lint_tools() -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let has = |tool: &str| succeeds(Command::new(&cargo).args([tool, "--version"]));
    if has("fmt") && has("clippy") {
        return Ok(());
    }
    eprintln!("cargo xtask: installing rustfmt and clippy (rustup component add)");
    let added = succeeds(Command::new("rustup").args(["component", "add", "rustfmt", "clippy"]));
    match added && has("fmt") && has("clippy") {
        true => Ok(()),
        false => Err("the checks need rustfmt and clippy: run `rustup component add rustfmt clippy` (or install your distribution's rustfmt and clippy)".into()),
    }
}

/// Installs `packages` with pip into the Python that runs them (as root
/// into a distribution's own Python too: PEP 668 would refuse it
/// otherwise), or where `options` say.
fn pip_install(packages: &[&str], options: &[&str], what: &str) -> Result<(), String> {
    eprintln!(
        "cargo xtask: installing {} from PyPI ({what})",
        packages.join(" ")
    );
    let status = Command::new(python())
        .args(["-m", "pip", "install", "--quiet"])
        .args(options)
        .args(packages)
        .env("PIP_BREAK_SYSTEM_PACKAGES", "1")
        .stdin(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run pip: {e}"))?;
    if !status.success() {
        return Err(format!(
            "`{} -m pip install {} {}` failed ({status}); install it by hand and run the command again",
            python(),
            options.join(" "),
            packages.join(" ")
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::is_libclang_dev;

    #[test]
    fn only_a_development_libclang_counts() {
        for dev in ["libclang.so", "libclang-14.so", "libclang-18.1.so"] {
            assert!(is_libclang_dev(dev), "{dev}");
        }
        for not in [
            "libclang.so.1",
            "libclang-14.so.1",
            "libclang-cpp.so",
            "libclang-cpp.so.14",
            "libclang-.so",
            "libclangBasic.a",
        ] {
            assert!(!is_libclang_dev(not), "{not}");
        }
    }
}
