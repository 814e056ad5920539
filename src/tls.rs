//! TLS for the connections to the stores (Redis, Postgres): the one crypto provider
//! (rustls with ring, no OpenSSL), and telling a refused certificate apart from a store
//! that is down, so that the start stops on the first and waits out the second.

/// Installs rustls's ring provider for the process; a second call finds it installed.
pub(crate) fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Why the TLS handshake refused a certificate (the server's, or ours), if that is what
/// `error` or one of its causes says; `None` for any other failure.
pub(crate) fn refusal(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cause = Some(error);
    while let Some(current) = cause {
        if let Some(tls) = current.downcast_ref::<rustls::Error>() {
            return Some(tls.to_string());
        }
        // An I/O error carries the handshake's error as its inner error, not its source.
        let inner = current
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref);
        if let Some(tls) = inner.and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
            return Some(tls.to_string());
        }
        // A client that flattens the handshake's error into text (the redis crate does)
        // still carries rustls's words.
        let text = current.to_string();
        if RUSTLS_WORDS.iter().any(|words| text.contains(words)) {
            return Some(text);
        }
        cause = current.source();
    }
    None
}

/// How rustls's errors about certificates and the handshake begin.
const RUSTLS_WORDS: [&str; 5] = [
    "invalid peer certificate",
    "received fatal alert",
    "peer is incompatible",
    "peer misbehaved",
    "no certificates presented",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_refused_inside_an_io_error_is_found_and_a_refused_connection_is_not() {
        let refused = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, refused);
        assert!(refusal(&io).is_some_and(|why| why.contains("UnknownIssuer")));
        let down = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(refusal(&down), None);
        let flattened = std::io::Error::other("invalid peer certificate: BadSignature");
        assert!(refusal(&flattened).is_some());
    }
}
