//! [`serve`]: an actix-web server for these routes whose every answer is JSON, even the ones the
//! HTTP layer produces by itself.
//!
//! actix-http answers a request it cannot parse (bad framing: 400), one whose head is too large
//! (431) and one whose head is too slow (408) on its own, before any route or middleware runs,
//! with an empty body. [`serve`] runs the same HTTP/1.1 service as `actix_web::HttpServer`,
//! over connections wrapped in [`JsonErrors`], which gives exactly those bodiless error answers
//! the adapter's JSON error body (`{"error": {"type", "message"}}`) on their way out. It also
//! closes an event stream as soon as its client hangs up (`h1_allow_half_closed(false)`), so a
//! server with many streams never holds the sockets of gone clients, and sets `TCP_NODELAY` on
//! every connection: an event's frame goes out when it is written, not after the client's
//! delayed ACK of the previous one (Nagle's algorithm; up to 40 ms on Linux).

use std::fmt;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_http::body::MessageBody;
use actix_http::{HttpService, Request, Response};
use actix_rt::net::TcpStream;
use actix_service::{
    fn_service, map_config, IntoServiceFactory, Service, ServiceFactory, ServiceFactoryExt,
};
use actix_web::dev::{AppConfig, Server};
use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The address of the listener a connection came through, in its requests' connection data:
/// the `Host` check's default depends on it (see [`super::HttpOptions::allowed_host`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Listener(pub(super) SocketAddr);

/// How [`serve`] runs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Worker threads. Default: one per physical core (actix-web's default).
    pub workers: Option<usize>,
    /// How long a graceful stop waits for open requests (event streams never end by themselves).
    /// Default 2 s.
    pub shutdown_timeout: Duration,
    /// Install actix's SIGINT/SIGTERM handlers. Default `false`: stop through the server's handle,
    /// then shut the runtime down.
    pub signals: bool,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            workers: None,
            shutdown_timeout: Duration::from_secs(2),
            signals: false,
        }
    }
}

/// Serves the app `factory` builds (once per worker) on `listeners`, as `actix_web::HttpServer`
/// would over HTTP/1.1, with JSON bodies on the HTTP layer's own errors (see the module docs).
/// Await the returned server (or stop it through its handle).
///
/// # Errors
/// When a listener cannot be registered (its address is named).
pub fn serve<F, I, S, B>(
    listeners: Vec<TcpListener>,
    options: &ServeOptions,
    factory: F,
) -> io::Result<Server>
where
    F: Fn() -> I + Send + Clone + 'static,
    I: IntoServiceFactory<S, Request>,
    S: ServiceFactory<Request, Config = AppConfig> + 'static,
    S::Error: Into<actix_web::Error> + 'static,
    S::InitError: fmt::Debug,
    S::Response: Into<Response<B>> + 'static,
    <S::Service as Service<Request>>::Future: 'static,
    S::Service: 'static,
    B: MessageBody + 'static,
{
    let mut builder = Server::build().shutdown_timeout(options.shutdown_timeout.as_secs().max(1));
    if let Some(workers) = options.workers {
        builder = builder.workers(workers.max(1));
    }
    if !options.signals {
        builder = builder.disable_signals();
    }
    for listener in listeners {
        let addr = listener.local_addr()?;
        let factory = factory.clone();
        builder = builder
            .listen(format!("durable-sessions-{addr}"), listener, move || {
                let app = factory()
                    .into_factory()
                    .map_err(|e| e.into().error_response());
                let http = HttpService::build()
                    .h1_allow_half_closed(false)
                    .on_connect_ext(move |_: &JsonErrors<TcpStream>, data| {
                        data.insert(Listener(addr));
                    })
                    .local_addr(addr)
                    // (Used only when a request has no `Host` header.)
                    .h1(map_config(app, |_| AppConfig::default()));
                fn_service(|io: TcpStream| async move {
                    // An event stream writes a small frame per event: sent at once, not held
                    // back by Nagle's algorithm until the client's (delayed) ACK of the last.
                    let _ = io.set_nodelay(true);
                    let peer: Option<SocketAddr> = io.peer_addr().ok();
                    Ok((JsonErrors::new(io), peer))
                })
                .and_then(http)
            })
            .map_err(|e| io::Error::new(e.kind(), format!("cannot serve on {addr}: {e}")))?;
    }
    Ok(builder.run())
}

/// A connection whose bodiless 400, 408 and 431 answers (the HTTP layer's own) get the JSON
/// error body on the way out; everything else passes through untouched.
#[derive(Debug)]
pub struct JsonErrors<T> {
    io: T,
    /// Rewritten bytes not yet written to `io`.
    pending: Vec<u8>,
    written: usize,
}

impl<T> JsonErrors<T> {
    /// Wraps a connection.
    pub fn new(io: T) -> Self {
        Self {
            io,
            pending: Vec::new(),
            written: 0,
        }
    }
}

/// The JSON answer that replaces a bodiless error head at the start of `buf`, and how many
/// bytes of `buf` it replaces.
fn rewrite(buf: &[u8]) -> Option<(Vec<u8>, usize)> {
    let (kind, message) = if buf.starts_with(b"HTTP/1.1 400 ") || buf.starts_with(b"HTTP/1.0 400 ")
    {
        (
            "bad_request",
            "the request is not valid HTTP/1.1 (bad framing)",
        )
    } else if buf.starts_with(b"HTTP/1.1 431 ") || buf.starts_with(b"HTTP/1.0 431 ") {
        (
            "request_header_fields_too_large",
            "the request head is too large",
        )
    } else if buf.starts_with(b"HTTP/1.1 408 ") || buf.starts_with(b"HTTP/1.0 408 ") {
        ("request_timeout", "the request head did not arrive in time")
    } else {
        return None;
    };
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = std::str::from_utf8(&buf[..end]).ok()?;
    let lower = head.to_ascii_lowercase();
    let at = lower.find("\r\ncontent-length: 0\r\n")?;
    if lower.contains("\r\ncontent-type:") {
        return None;
    }
    let body = json!({ "error": { "type": kind, "message": message } }).to_string();
    let replaced = format!(
        "{}\r\ncontent-type: application/json\r\ncontent-length: {}{}{body}",
        &head[..at],
        body.len(),
        &head[at + "\r\ncontent-length: 0".len()..],
    );
    Some((replaced.into_bytes(), end))
}

impl<T: AsyncWrite + Unpin> JsonErrors<T> {
    /// Writes what is pending; ready once nothing is.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.pending.len() {
            let n = match Pin::new(&mut self.io).poll_write(cx, &self.pending[self.written..]) {
                Poll::Ready(Ok(n)) => n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.pending.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for JsonErrors<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for JsonErrors<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        match this.poll_pending(cx) {
            Poll::Ready(Ok(())) => {}
            other => return other.map(|r| r.map(|()| 0)),
        }
        if let Some((replaced, consumed)) = rewrite(buf) {
            this.pending = replaced;
            this.written = 0;
            // The bytes are ours now; a pending write finishes on the next write or flush.
            let _ = this.poll_pending(cx)?;
            return Poll::Ready(Ok(consumed));
        }
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match this.poll_pending(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.io).poll_flush(cx),
            other => other,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match this.poll_pending(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.io).poll_shutdown(cx),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::rewrite;

    #[test]
    fn gives_bodiless_error_heads_a_json_body_and_leaves_the_rest() {
        let head = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
        let (bytes, consumed) = rewrite(head).unwrap_or_default();
        assert_eq!(consumed, head.len());
        let text = String::from_utf8(bytes).unwrap_or_default();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or_default();
        assert!(head.contains("content-type: application/json"), "{head}");
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        assert!(head.contains("connection: close"), "{head}");
        assert!(body.contains("request_header_fields_too_large"), "{body}");
        let json = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 12\r\ncontent-type: application/json\r\n\r\n{\"error\":{}}";
        assert!(rewrite(json).is_none(), "the adapter's own errors pass");
        assert!(rewrite(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_none());
    }
}
