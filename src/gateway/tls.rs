//! TLS for the S3 leg (`--tls-cert`, `--tls-key`): rustls with the ring
//! provider, TLS 1.2 and 1.3, HTTP/1.1 offered by ALPN (the server speaks
//! nothing else). Only the S3 requests go through it: RDMA payloads never
//! touch the TCP connection.

use std::path::Path;
use std::sync::Arc;

use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{crypto, ServerConfig};
use tokio_rustls::TlsAcceptor;

use crate::gateway::cli::Tls;

/// The acceptor for the certificate chain and key that `tls` names, or
/// why they cannot serve (naming the file and what to check).
pub fn acceptor(tls: &Tls) -> Result<TlsAcceptor, String> {
    let certs = certificates(&tls.cert)?;
    let key = PrivateKeyDer::from_pem_file(&tls.key).map_err(|e| {
        format!(
            "--tls-key {}: no private key read: {e} (expected a PEM file holding a PRIVATE \
             KEY, RSA PRIVATE KEY or EC PRIVATE KEY)",
            tls.key.display()
        )
    })?;
    let provider = Arc::new(crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            format!(
                "--tls-cert {} with --tls-key {}: {e} (is the key the certificate's?)",
                tls.cert.display(),
                tls.key.display()
            )
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The certificates of a PEM file, the server's first.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let shown = path.display();
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("--tls-cert {shown}: {e}"))?;
    if certs.is_empty() {
        return Err(format!(
            "--tls-cert {shown}: no CERTIFICATE in the file (expected a PEM certificate chain, \
             the server's certificate first)"
        ));
    }
    Ok(certs)
}
