//! Clients that keep a server's request open on purpose, as a hostile or
//! stalled client does: [`trickle`] sends a request body one byte at a time,
//! [`stall_after_head`] reads a response's head and then never reads its body.
//! Both speak raw HTTP/1.1 over TCP, so nothing buffers or times out for them.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use crate::util::within;

/// How a [`trickle`] client's exchange ended.
#[derive(Debug, Clone)]
pub struct Trickled {
    /// The body bytes sent.
    pub sent: usize,
    /// What the server answered (the head at least, when it answered), lossy
    /// UTF-8.
    pub answer: String,
    /// When the answer's head was complete, if it was.
    pub answered_at: Option<Instant>,
}

impl Trickled {
    /// The answer's status code, if a status line arrived.
    pub fn status(&self) -> Option<u16> {
        self.answer
            .strip_prefix("HTTP/1.1 ")
            .and_then(|rest| rest.get(..3))
            .and_then(|code| code.parse().ok())
    }
}

/// Sends `POST path` announcing `Content-Length: content_length`, then the
/// body one byte every `every`, at most `max_bytes` of it (so the exchange is
/// bounded), while reading what the server answers. Stops sending once the
/// answer's head has arrived or a write fails (the server closed), and stops
/// reading 2 s after the last byte was sent.
///
/// # Panics
/// When the connection cannot be made.
pub fn trickle(
    addr: SocketAddr,
    path: &str,
    content_length: usize,
    every: Duration,
    max_bytes: usize,
) -> JoinHandle<Trickled> {
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/octet-stream\r\n\
         Content-Length: {content_length}\r\n\r\n"
    );
    tokio::spawn(async move {
        let stream = within(Duration::from_secs(5), "connect", TcpStream::connect(addr))
            .await
            .expect("connect to the server");
        let (mut rx, mut tx) = stream.into_split();
        let mut out = Trickled {
            sent: 0,
            answer: String::new(),
            answered_at: None,
        };
        let mut writing = tx.write_all(head.as_bytes()).await.is_ok();
        let mut tick = tokio::time::interval(every);
        tick.tick().await;
        let mut read_until: Option<tokio::time::Instant> = None;
        let mut buf = [0u8; 4096];
        loop {
            let stop = read_until
                .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                _ = tick.tick(), if writing => {
                    writing = out.sent < max_bytes.min(content_length)
                        && tx.write_all(b"a").await.is_ok();
                    if writing {
                        out.sent += 1;
                    } else {
                        read_until = Some(tokio::time::Instant::now() + Duration::from_secs(2));
                    }
                }
                read = rx.read(&mut buf) => match read {
                    Ok(n) if n > 0 => {
                        out.answer.push_str(&String::from_utf8_lossy(&buf[..n]));
                        if out.answered_at.is_none() && out.answer.contains("\r\n\r\n") {
                            out.answered_at = Some(Instant::now());
                            return out;
                        }
                    }
                    _ => return out,
                },
                () = tokio::time::sleep_until(stop), if read_until.is_some() => return out,
            }
        }
    })
}

/// Sends `GET path`, reads the response until its head is complete (within
/// 5 s), and returns the connection, whose body is left unread, with the
/// head. The server's writes then fill the socket buffers and stall until
/// the stream is dropped.
///
/// # Panics
/// When the connection fails or no head arrives within 5 s.
pub async fn stall_after_head(addr: SocketAddr, path: &str) -> (TcpStream, String) {
    let mut stream = within(Duration::from_secs(5), "connect", TcpStream::connect(addr))
        .await
        .expect("connect to the server");
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes())
        .await
        .expect("send the request");
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = within(
            Duration::from_secs(5),
            "response head",
            stream.read(&mut buf),
        )
        .await
        .expect("read the response head");
        assert!(n > 0, "closed before the head: {seen:?}");
        seen.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&seen).into_owned();
    (stream, head)
}
