//! Mutual TLS between the processes of a cluster (rustls, through tonic): each presents its
//! certificate, signed by the cluster's CA, and accepts only peers whose certificate that CA
//! signed. Without it, gRPC between nodes is plaintext and only the cluster secret guards it.

use std::fmt;
use std::path::Path;

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig};

use crate::ProtoError;

/// This process's certificate and key, and the CA its peers' certificates must chain to.
#[derive(Clone)]
pub struct Tls {
    identity: Identity,
    ca: Certificate,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Tls(..)")
    }
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, ProtoError> {
    let bytes = std::fs::read(path).map_err(|e| ProtoError::Tls {
        reason: format!("reading the {what} {}: {e}", path.display()),
    })?;
    if !String::from_utf8_lossy(&bytes).contains("-----BEGIN ") {
        return Err(ProtoError::Tls {
            reason: format!("the {what} {} is not PEM", path.display()),
        });
    }
    Ok(bytes)
}

impl Tls {
    /// Reads PEM files: this process's certificate (chain) and private key, and the cluster's
    /// CA certificate.
    pub fn load(cert: &Path, key: &Path, ca: &Path) -> Result<Self, ProtoError> {
        Ok(Tls {
            identity: Identity::from_pem(read("certificate", cert)?, read("key", key)?),
            ca: Certificate::from_pem(read("CA certificate", ca)?),
        })
    }

    /// Loads the three files when all are given, none when none is; an error names what is
    /// missing otherwise.
    pub fn from_files(
        cert: Option<&Path>,
        key: Option<&Path>,
        ca: Option<&Path>,
    ) -> Result<Option<Self>, ProtoError> {
        match (cert, key, ca) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(ca)) => Self::load(cert, key, ca).map(Some),
            _ => Err(ProtoError::Tls {
                reason: "TLS needs all three of tls_cert, tls_key and tls_ca".into(),
            }),
        }
    }

    /// `endpoint` speaking TLS: it presents this process's certificate and checks the
    /// server's against the CA (and the URL's host).
    pub(crate) fn client(&self, endpoint: Endpoint) -> Result<Endpoint, ProtoError> {
        endpoint
            .tls_config(
                ClientTlsConfig::new()
                    .ca_certificate(self.ca.clone())
                    .identity(self.identity.clone()),
            )
            .map_err(|e| ProtoError::Tls {
                reason: format!("client TLS: {e}"),
            })
    }

    /// `server` speaking TLS: it presents this process's certificate and requires a client
    /// certificate the CA signed.
    pub(crate) fn server(&self, server: Server) -> Result<Server, ProtoError> {
        server
            .tls_config(
                ServerTlsConfig::new()
                    .identity(self.identity.clone())
                    .client_ca_root(self.ca.clone()),
            )
            .map_err(|e| ProtoError::Tls {
                reason: format!("server TLS: {e}"),
            })
    }
}
