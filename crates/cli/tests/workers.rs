//! Jobs over real worker processes of the `tidemark` binary, on loopback
//! and over mutual TLS: the same output as in one process, and exactly
//! once when a worker process is SIGKILLed at random moments (and
//! relaunched).

use tidemark_testkit as common;

use common::pki::TestCa;
use common::{assert_updates_exactly_once, committed_lines};
use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use tidemark_cli::{run, CliError, RunArgs, RunReport};

const BIN: &str = env!("CARGO_BIN_EXE_tidemark");

/// The committed output of a run, line by line with how often each
/// occurs: file names differ between runs, what they hold must not.
fn output(dir: &Path) -> BTreeMap<String, usize> {
    let mut lines = BTreeMap::new();
    for (_, line) in committed_lines(dir) {
        *lines.entry(line).or_default() += 1;
    }
    lines
}

fn run_with(args: &[String], output: &Path, checkpoints: &Path) -> Result<RunReport, CliError> {
    let mut args = args.to_vec();
    args.push(format!("--output={}", output.display()));
    args.push(format!("--checkpoint-dir={}", checkpoints.display()));
    if !args.iter().any(|a| a.starts_with("--worker-program=")) {
        args.push(format!("--worker-program={BIN}"));
    }
    run(&RunArgs::parse(&args).unwrap())
}

fn topology_args(topology: &str, records: u64, seed: u64) -> Vec<String> {
    vec![
        topology.to_string(),
        format!("--records={records}"),
        format!("--seed={seed}"),
        "--keys=2000".to_string(),
        "--parallelism=3".to_string(),
        "--checkpoint-interval=100ms".to_string(),
    ]
}

/// A CA for one test's processes, in a directory that lives as long as
/// the test: the worker tests run over mutual TLS, as an exposed cluster
/// would (the stranger test alone runs in the clear, where a stranger
/// reaches the hello).
fn cluster_ca() -> (tempfile::TempDir, TestCa) {
    let pki = tempfile::tempdir().unwrap();
    let ca = TestCa::new(pki.path(), "cluster");
    (pki, ca)
}

/// Runs `args` in this process and with `workers`, and returns both
/// reports once their outputs compared equal.
fn same_output(args: &[String], workers: &[String], context: &str) -> (RunReport, RunReport) {
    let (alone, spread) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (c1, c2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let local = run_with(args, alone.path(), c1.path()).unwrap();
    let mut remote_args = args.to_vec();
    remote_args.extend_from_slice(workers);
    let remote = run_with(&remote_args, spread.path(), c2.path())
        .unwrap_or_else(|e| panic!("{context}: {e}"));
    let (want, got) = (output(alone.path()), output(spread.path()));
    assert!(!want.is_empty(), "{context}: no output");
    assert!(
        want == got,
        "{context}: the output over worker processes differs"
    );
    common::assert_no_uncommitted_files(spread.path(), context);
    (local, remote)
}

/// Splits of a file source travel to the subtasks on worker processes
/// over the control plane, and a worker killed twice loses none.
#[test]
fn files_read_over_two_worker_processes_give_the_output_of_one_process() {
    let input = tempfile::tempdir().unwrap();
    for f in 0..6u64 {
        let text: String = (0..3_000u64)
            .map(|l| format!("w{} w{}\n", (f * 3_000 + l) % 701, l % 13))
            .collect();
        std::fs::write(input.path().join(format!("{f}.txt")), text).unwrap();
    }
    let args = vec![
        "wordcount".to_string(),
        format!(
            "--source={}?format=text&split-size=10000",
            input.path().display()
        ),
        "--parallelism=3".to_string(),
        "--checkpoint-interval=100ms".to_string(),
        "--records=18000".to_string(),
        // Long enough (1.2 s) for both kills to land.
        "--rate=15000".to_string(),
    ];
    let (_pki, ca) = cluster_ca();
    let mut workers = ca.flags("driver");
    workers.extend(["--workers=2".to_string(), "--inject-failures=2".to_string()]);
    let (local, remote) = same_output(&args, &workers, "files over 2 workers");
    assert_eq!(local.records_in, 18_000);
    assert_eq!(remote.restarts, 2, "both kills landed");
}

#[test]
fn topologies_over_two_and_three_worker_processes_give_the_output_of_one_process() {
    let (_pki, ca) = cluster_ca();
    for topology in ["wordcount", "windows", "join"] {
        for workers in [2, 3] {
            let context = format!("{topology} over {workers} workers");
            let args = topology_args(topology, 300_000, 1);
            let mut flags = ca.flags("driver");
            flags.push(format!("--workers={workers}"));
            let (local, remote) = same_output(&args, &flags, &context);
            assert_eq!(remote.records_in, local.records_in, "{context}");
            assert!(
                remote.link_bytes_sent > 0,
                "{context}: nothing crossed a link"
            );
            assert!(remote.checkpoints_completed > 0, "{context}: no checkpoint");
        }
    }
}

/// Wordcount with every update emitted, over two worker processes, three
/// of which are SIGKILLed per seed at random moments; each is relaunched
/// and the job restores its latest checkpoint.
fn sigkills(seeds: std::ops::Range<u64>, extra: &[&str]) -> Vec<RunReport> {
    const RECORDS: u64 = 400_000;
    const KEYS: u64 = 2_000;
    seeds
        .map(|seed| {
            let context = format!("{extra:?} seed {seed}");
            let (out, checkpoints) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
            let mut args = vec![
                "wordcount".to_string(),
                format!("--records={RECORDS}"),
                format!("--keys={KEYS}"),
                format!("--seed={seed}"),
                "--parallelism=2".to_string(),
                "--rate=200000".to_string(),
                "--emit=updates".to_string(),
                "--checkpoint-interval=100ms".to_string(),
                "--workers=2".to_string(),
                "--inject-failures=3".to_string(),
            ];
            args.extend(extra.iter().map(|s| s.to_string()));
            let (_pki, ca) = cluster_ca();
            args.extend(ca.flags("driver"));
            let report = run_with(&args, out.path(), checkpoints.path())
                .unwrap_or_else(|e| panic!("{context}: {e}"));
            assert_updates_exactly_once(out.path(), RECORDS, KEYS, seed, &context);
            assert!(report.restarts >= 1, "{context}: no worker was killed");
            common::assert_no_uncommitted_files(out.path(), &context);
            report
        })
        .collect()
}

#[test]
fn sigkilled_worker_processes_are_exactly_once_aligned_and_unaligned() {
    sigkills(0..3, &["--mode=aligned"]);
    let reports = sigkills(
        0..3,
        &["--mode=unaligned", "--slow-subtask=0", "--slow-ns=2000"],
    );
    let replayed: u64 = reports.iter().map(|r| r.restored_inflight_batches).sum();
    assert!(replayed > 0, "no restore replayed in-flight batches");
}

#[test]
fn sigkilled_worker_processes_with_rocksdb_incremental_are_exactly_once() {
    sigkills(
        0..2,
        &["--state=rocksdb", "--incremental", "--mode=unaligned"],
    );
}

#[test]
fn windows_and_join_survive_sigkilled_worker_processes_with_the_same_output() {
    let (_pki, ca) = cluster_ca();
    for topology in ["windows", "join"] {
        for seed in 0..2 {
            let context = format!("{topology} seed {seed}");
            let args = topology_args(topology, 300_000, seed);
            let (_, remote) = same_output(
                &args,
                &[
                    ca.flags("driver"),
                    vec![
                        "--workers=2".into(),
                        "--inject-failures=2".into(),
                        "--mode=unaligned".into(),
                        // Reading takes about a second, so that the kills come
                        // due while the subtasks run, on a loaded machine too:
                        // unlimited, a CI run once saw neither kill restart
                        // the job.
                        "--rate=100000".into(),
                    ],
                ]
                .concat(),
                &context,
            );
            assert!(remote.restarts >= 1, "{context}: no worker was killed");
        }
    }
}

/// A worker started by hand, as on Kubernetes, with `extra` flags: its
/// control address.
fn start_worker(extra: &[String]) -> (Child, String) {
    let mut child = Command::new(BIN)
        .args(["worker", "--exit-with-stdin"])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let address = line
        .trim()
        .strip_prefix("tidemark worker listening on ")
        .unwrap_or_else(|| panic!("the worker said {line:?}"))
        .to_owned();
    (child, address)
}

#[test]
fn workers_started_by_hand_run_jobs_one_after_another() {
    let (_pki, ca) = cluster_ca();
    let workers: Vec<(Child, String)> = (0..2)
        .map(|i| start_worker(&ca.flags(&format!("worker-{i}"))))
        .collect();
    let addresses: Vec<&str> = workers.iter().map(|(_, a)| a.as_str()).collect();
    let flag = format!("--worker-addrs={}", addresses.join(","));
    let mut flags = ca.flags("driver");
    flags.push(flag.clone());
    for topology in ["wordcount", "join"] {
        same_output(
            &topology_args(topology, 200_000, 3),
            &flags,
            &format!("{topology} on {flag}"),
        );
    }
    for (mut child, _) in workers {
        // Closing stdin ends a worker started with --exit-with-stdin.
        drop(child.stdin.take());
        assert!(child.wait().unwrap().success());
    }
}

/// A worker started with `--root` refuses a job whose checkpoints lie
/// elsewhere, naming the flag and its roots, and runs one inside them.
#[test]
fn a_worker_refuses_a_job_whose_locations_are_outside_its_roots() {
    let (root, elsewhere) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_pki, ca) = cluster_ca();
    let mut flags = ca.flags("worker");
    flags.push(format!("--root={}", root.path().display()));
    let (mut worker, address) = start_worker(&flags);
    let mut args = topology_args("wordcount", 20_000, 3);
    args.extend(ca.flags("driver"));
    args.extend([
        format!("--worker-addrs={address}"),
        "--max-restarts=0".into(),
    ]);
    let outside = elsewhere.path().join("checkpoints");
    let output = root.path().join("out");
    let err = run_with(&args, &output, &outside).unwrap_err().to_string();
    assert!(err.contains("outside this worker's roots"), "{err}");
    assert!(err.contains("--checkpoint-dir"), "{err}");

    run_with(&args, &output, &root.path().join("checkpoints")).unwrap();
    assert!(!self::output(&output).is_empty());
    drop(worker.stdin.take());
    assert!(worker.wait().unwrap().success());
}

/// Workers started by hand with TLS take only peers whose certificates
/// chain to their CA, on either port: a driver without TLS or with a
/// certificate of another CA is refused, and so is a link between two
/// workers that do not trust each other's CA, whichever of them dials;
/// a driver they trust runs the job.
#[test]
fn workers_with_tls_take_only_peers_whose_certificates_chain_to_their_ca() {
    let pki = tempfile::tempdir().unwrap();
    let (ours, theirs) = (
        TestCa::new(pki.path(), "ours"),
        TestCa::new(pki.path(), "theirs"),
    );
    let both = pki.path().join("both-ca.pem");
    let pem = |path: &Path| std::fs::read_to_string(path).unwrap();
    std::fs::write(&both, pem(&ours.ca) + &pem(&theirs.ca)).unwrap();
    // `trusting` trusts our CA alone; `foreign` has their certificate
    // and trusts both, so the driver (ours, trusting both) reaches both.
    let trusting = start_worker(&ours.flags("trusting"));
    let foreign = start_worker(&theirs.issue("foreign").flags(&both));
    let driver = ours.issue("driver").flags(&both);
    let run = |addresses: &[&str], tls: &[String]| {
        let (out, checkpoints) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut args = topology_args("wordcount", 20_000, 3);
        args.push(format!("--worker-addrs={}", addresses.join(",")));
        args.push("--max-restarts=0".into());
        args.extend_from_slice(tls);
        run_with(&args, out.path(), checkpoints.path()).map(|_| output(out.path()))
    };
    let stranger = theirs.flags("stranger");
    for (tls, who) in [(&[][..], "without TLS"), (&stranger[..], "of another CA")] {
        let refused = run(&[&trusting.1], tls).unwrap_err().to_string();
        assert!(refused.contains(&trusting.1), "a driver {who}: {refused}");
    }
    // The lower worker dials: first the trusting one refuses the foreign
    // one's certificate as a server's, then as a client's.
    for pair in [[&*trusting.1, &*foreign.1], [&*foreign.1, &*trusting.1]] {
        let refused = run(&pair, &driver).unwrap_err().to_string();
        assert!(refused.contains("link"), "{pair:?}: {refused}");
    }
    let alone = run(&[&trusting.1], &driver).unwrap();
    assert!(!alone.is_empty());
    for (mut child, _) in [trusting, foreign] {
        drop(child.stdin.take());
        assert!(child.wait().unwrap().success());
    }
}

/// Beyond loopback a worker without TLS is anyone's: it refuses to start
/// unless told the network is trusted.
#[test]
fn a_worker_without_tls_serves_beyond_loopback_only_when_told_to() {
    let refused = Command::new(BIN)
        .args(["worker", "--listen=0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("0.0.0.0:0") && said.contains("--insecure"),
        "{said}"
    );
    let (mut insecure, _) = start_worker(&["--listen=0.0.0.0:0".into(), "--insecure".into()]);
    drop(insecure.stdin.take());
    assert!(insecure.wait().unwrap().success());
}

/// The resident memory of process `pid`, in MiB.
fn rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib / 1024
}

/// Strangers at a worker's data port before any job: one declaring a
/// hello of 256 MiB and sending 128 MiB of it, then 10,000 that connect
/// and say nothing. The worker buffers none of it, and a job over it,
/// with the strangers still connected, gives the output of one process.
#[test]
fn strangers_at_the_data_port_cost_no_memory_and_harm_no_job() {
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    let data = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (mut stranger_target, address) = start_worker(&[format!("--data={data}")]);
    let (mut peer, peer_address) = start_worker(&[]);
    let idle = rss_mib(stranger_target.id());

    let mut big = TcpStream::connect(data).unwrap();
    let mut sent = big.write_all(&(256u32 << 20).to_be_bytes()).map(|()| 4);
    let chunk = vec![0u8; 1 << 20];
    for _ in 0..128 {
        // The worker closes the link on its header: writing fails soon.
        sent = sent.and_then(|n| big.write_all(&chunk).map(|()| n + chunk.len()));
    }
    let sent = sent.unwrap_or(0);
    assert!(
        sent < 64 << 20,
        "the worker took {sent} bytes of a 256 MiB hello"
    );
    let strangers: Vec<TcpStream> = (0..10_000)
        .map(|i| TcpStream::connect(data).unwrap_or_else(|e| panic!("connection {i}: {e}")))
        .collect();
    let flooded = rss_mib(stranger_target.id());
    assert!(
        flooded < idle + 100,
        "idle {idle} MiB, {flooded} MiB with {} strangers connected",
        strangers.len()
    );

    let flag = format!("--worker-addrs={address},{peer_address}");
    same_output(
        &topology_args("wordcount", 200_000, 5),
        std::slice::from_ref(&flag),
        "wordcount beside the strangers",
    );
    drop(strangers);
    for child in [&mut stranger_target, &mut peer] {
        drop(child.stdin.take());
        assert!(child.wait().unwrap().success());
    }
}

#[test]
fn storage_of_one_process_is_refused_with_worker_processes() {
    let out = tempfile::tempdir().unwrap();
    let args: Vec<String> = [
        "wordcount",
        "--records=1000",
        "--workers=2",
        "--checkpoint-dir=memory://workers-refused",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!("--output={}", out.path().display())])
    .collect();
    let error = run(&RunArgs::parse(&args).unwrap())
        .unwrap_err()
        .to_string();
    assert!(error.contains("memory://workers-refused"), "{error}");
    assert!(error.contains("worker processes"), "{error}");
}

/// The pids of the processes running `program` (by the name they were
/// started with), which only one test uses.
fn processes_of(program: &Path) -> Vec<u32> {
    let program = program.to_str().unwrap();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline =
                std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            cmdline.split('\0').next() == Some(program)
        })
        .collect()
}

#[test]
fn a_hung_worker_process_is_found_by_its_silence_and_replaced() {
    const RECORDS: u64 = 600_000;
    const KEYS: u64 = 1_000;
    let (out, checkpoints) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // Its workers run under a name of their own: other tests launch
    // workers from this process too.
    let programs = tempfile::tempdir().unwrap();
    let program = programs.path().join("tidemark-hung");
    std::os::unix::fs::symlink(BIN, &program).unwrap();
    let mut args: Vec<String> = [
        "wordcount",
        "--keys=1000",
        "--seed=4",
        "--parallelism=2",
        "--rate=100000",
        "--emit=updates",
        "--checkpoint-interval=100ms",
        "--workers=2",
        "--records=600000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(format!("--worker-program={}", program.display()));
    let (_pki, ca) = cluster_ca();
    args.extend(ca.flags("driver"));
    let watched = out.path().to_owned();
    let launched = program.clone();
    // Once a checkpoint committed output, one worker stops answering
    // (SIGSTOP) without its connections closing.
    let stopper = std::thread::spawn(move || loop {
        let committed = !committed_lines(&watched).is_empty();
        match processes_of(&launched).first() {
            Some(pid) if committed => {
                let stopped = Command::new("kill")
                    .args(["-STOP", &pid.to_string()])
                    .status();
                return stopped.unwrap().success();
            }
            _ => std::thread::sleep(std::time::Duration::from_millis(5)),
        }
    });
    let report = run_with(&args, out.path(), checkpoints.path()).unwrap();
    assert!(stopper.join().unwrap(), "the worker was stopped");
    assert!(report.restarts >= 1, "the hung worker went unnoticed");
    assert_updates_exactly_once(out.path(), RECORDS, KEYS, 4, "a hung worker");
}
