//! The sandbox's network namespace: its own loopback is up (Nsight Compute talks to the process it
//! profiles over a local port), and nothing outside the namespace can be reached through it.

mod worker_support;

use std::io::Read;
use std::path::PathBuf;

use krefine::worker::sandbox::{self, SandboxSpec};
use worker_support::test_python;

const PROBE: &str = r#"
import socket, sys
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(1)
client = socket.create_connection(server.getsockname(), timeout=2)
peer, _ = server.accept()
client.sendall(b"ping")
inside = peer.recv(4) == b"ping"
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2).sendall(b"escaped")
    outside = "connected"
except OSError as e:
    outside = type(e).__name__
print(f"inside={int(inside)} outside={outside}")
"#;

#[tokio::test]
async fn loopback_is_up_inside_and_the_host_stays_out_of_reach() {
    let python = test_python().await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("host listener");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port();
    let spec = SandboxSpec {
        writable: Vec::new(),
        visible: sandbox::python_dirs(&python),
        hidden: SandboxSpec::default_hidden(),
        overlays: Vec::new(),
        cwd: PathBuf::from("/"),
    };
    // `-c` leaves sys.argv as ["-c"]; the port goes in through the code itself.
    let code = format!("import sys\nsys.argv = ['-c', '{port}']\n{PROBE}");
    let out = tokio::task::spawn_blocking(move || sandbox::run_sandboxed(&python, &spec, &code))
        .await
        .expect("join")
        .expect("the sandboxed probe runs");
    assert_eq!(out.trim(), "inside=1 outside=ConnectionRefusedError");
    let mut stray = Vec::new();
    if let Ok((mut s, _)) = listener.accept() {
        let _ = s.read_to_end(&mut stray);
    }
    assert!(stray.is_empty(), "the host's listener was reached");
}
