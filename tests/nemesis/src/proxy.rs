//! A TCP proxy in front of the registry's Unix socket: everything that
//! leases (the self-leasing primary's lease worker, the client processes)
//! reaches the registry through it, so the nemesis can delay replies, drop
//! them (a connection that stays open and silent) and cut connections.
//! At a registry failover it is pointed at the promoted server's socket,
//! as a virtual IP or a DNS name would be.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const PASS: u8 = 0;
const DELAY: u8 = 1;
const DROP: u8 = 2;

pub struct Proxy {
    pub port: u16,
    mode: Arc<AtomicU8>,
    delay_ms: Arc<AtomicU64>,
    open: Arc<Mutex<HashMap<u64, (TcpStream, UnixStream)>>>,
    target: Arc<Mutex<PathBuf>>,
}

impl Proxy {
    pub fn start(socket: PathBuf) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().unwrap().port();
        let proxy = Proxy {
            port,
            mode: Arc::new(AtomicU8::new(PASS)),
            delay_ms: Arc::new(AtomicU64::new(0)),
            open: Arc::default(),
            target: Arc::new(Mutex::new(socket)),
        };
        let (mode, delay, open, target) = (proxy.mode.clone(), proxy.delay_ms.clone(), proxy.open.clone(), proxy.target.clone());
        std::thread::spawn(move || {
            for (id, client) in listener.incoming().flatten().enumerate() {
                let id = id as u64;
                let socket = target.lock().unwrap().clone();
                let Ok(server) = UnixStream::connect(&socket) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                open.lock().unwrap().insert(id, (client.try_clone().unwrap(), server.try_clone().unwrap()));
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (m1, d1, m2, d2) = (mode.clone(), delay.clone(), mode.clone(), delay.clone());
                let (o1, o2) = (open.clone(), open.clone());
                std::thread::spawn(move || {
                    pump(client, server, m1, d1);
                    close(&o1, id);
                });
                std::thread::spawn(move || {
                    pump(s2, c2, m2, d2);
                    close(&o2, id);
                });
            }
        });
        proxy
    }

    /// New connections go to `socket`; those open now are cut.
    pub fn retarget(&self, socket: PathBuf) -> usize {
        *self.target.lock().unwrap() = socket;
        self.cut()
    }

    pub fn pass(&self) {
        self.mode.store(PASS, Ordering::SeqCst);
    }

    pub fn delay(&self, ms: u64) {
        self.delay_ms.store(ms, Ordering::SeqCst);
        self.mode.store(DELAY, Ordering::SeqCst);
    }

    /// Bytes are read and thrown away: connections stay open, silent.
    pub fn drop_all(&self) {
        self.mode.store(DROP, Ordering::SeqCst);
    }

    /// Close every connection now open.
    pub fn cut(&self) -> usize {
        let open = std::mem::take(&mut *self.open.lock().unwrap());
        for (c, s) in open.values() {
            let _ = c.shutdown(Shutdown::Both);
            let _ = s.shutdown(Shutdown::Both);
        }
        open.len()
    }
}

fn pump(mut from: impl Read, mut to: impl Write, mode: Arc<AtomicU8>, delay_ms: Arc<AtomicU64>) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        match mode.load(Ordering::SeqCst) {
            DROP => continue,
            DELAY => std::thread::sleep(Duration::from_millis(delay_ms.load(Ordering::SeqCst))),
            _ => {}
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
}

/// One direction ended: end both, and forget the connection.
fn close(open: &Mutex<HashMap<u64, (TcpStream, UnixStream)>>, id: u64) {
    if let Some((c, s)) = open.lock().unwrap().remove(&id) {
        let _ = c.shutdown(Shutdown::Both);
        let _ = s.shutdown(Shutdown::Both);
    }
}
