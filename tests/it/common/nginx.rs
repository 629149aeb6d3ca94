//! nginx (from apt) as a shared HTTP cache in front of a server: `proxy_cache` with
//! `proxy_cache_lock`, nothing else configured, so what it keeps is what the origin's own
//! `Cache-Control` allows.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// nginx running `conf` in a process group of its own, stopped when dropped.
pub struct Nginx(Child);

impl Drop for Nginx {
    /// SIGTERM to the master, which stops its workers and cache manager and waits for them
    /// before it exits; the group is then killed in case the master died first (SIGKILL from
    /// outside would leave its workers serving the port with parent 1).
    fn drop(&mut self) {
        super::stop_gracefully(&mut self.0);
        if let Some(group) = rustix::process::Pid::from_raw(self.0.id() as i32) {
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
    }
}

fn nginx_binary() -> &'static str {
    super::external("nginx");
    ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("nginx is not installed: scripts/test installs it (scripts/apt-need nginx=nginx)")
}

pub fn start_nginx(work: &Path, origin: &str) -> (Nginx, String) {
    use std::os::unix::fs::PermissionsExt as _;
    // nginx's workers run as another user when the test runs as root.
    for dir in ["", "cache", "tmp"] {
        let path = work.join(dir);
        std::fs::create_dir_all(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let w = work.display();
    let conf = format!(
        "worker_processes 2;\npid {w}/nginx.pid;\nerror_log {w}/error.log warn;\ndaemon off;\n\
         events {{ worker_connections 256; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {w}/tmp;\n  proxy_temp_path {w}/tmp;\n\
           fastcgi_temp_path {w}/tmp;\n  uwsgi_temp_path {w}/tmp;\n  scgi_temp_path {w}/tmp;\n\
           proxy_cache_path {w}/cache keys_zone=models:10m max_size=1g inactive=1h use_temp_path=off;\n\
           server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      proxy_pass http://{origin};\n\
               proxy_http_version 1.1;\n      proxy_cache models;\n      proxy_cache_lock on;\n\
               proxy_cache_lock_timeout 1h;\n      proxy_cache_lock_age 1h;\n    }}\n  }}\n}}\n"
    );
    std::fs::write(work.join("nginx.conf"), conf).unwrap();
    use std::os::unix::process::CommandExt as _;
    let child = Command::new(nginx_binary())
        .process_group(0)
        .arg("-c")
        .arg(work.join("nginx.conf"))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let nginx = Nginx(child);
    let address = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while super::request_status(&address, "/healthz").is_none() {
        assert!(Instant::now() < deadline, "nginx did not start: {}", work.join("error.log").display());
        std::thread::sleep(Duration::from_millis(50));
    }
    (nginx, address)
}
