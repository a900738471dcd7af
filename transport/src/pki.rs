//! The cluster CA and the certificates it signs. One self-signed CA per cluster; every node and
//! every user holds a leaf signed by it, and no other root is ever trusted.

use std::fmt;
use std::fs;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

/// The DNS name every node certificate carries and every client asks for, whatever address it
/// dials: nodes are told apart by their certificate's common name, not by the name dialed.
pub const SERVER_NAME: &str = "corral.cluster";

/// Prefix of the common name of a user's client certificate: `user:<name>`.
pub const USER_CN_PREFIX: &str = "user:";

const CA_VALIDITY_DAYS: u64 = 3650;
const LEAF_VALIDITY_DAYS: u64 = 365;
/// Certificates start to be valid this long before they are made, for clocks a little behind.
const BACKDATE_SECS: u64 = 3600;

/// A certificate and its private key, both PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct PemPair {
    pub cert_pem: String,
    pub key_pem: String,
}

impl fmt::Debug for PemPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PemPair").field("cert_pem", &self.cert_pem).field("key_pem", &"[elided]").finish()
    }
}

fn validity(params: &mut CertificateParams, days: u64) {
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::from_secs(BACKDATE_SECS);
    params.not_after = now + Duration::from_secs(days * 24 * 3600);
}

fn new_serial(params: &mut CertificateParams, salt: &[u8]) {
    // Unique enough for a private CA: hash of the time and the subject, top bit cleared so the
    // integer stays positive in 20 bytes.
    let mut hasher = Sha256::new();
    let now_ns = OffsetDateTime::now_utc().unix_timestamp_nanos();
    hasher.update(now_ns.to_be_bytes());
    hasher.update(std::process::id().to_be_bytes());
    hasher.update(salt);
    let digest = hasher.finalize();
    let mut serial = digest[..20].to_vec();
    serial[0] &= 0x7f;
    serial[0] |= 0x01 << 6; // never a leading zero byte
    params.serial_number = Some(serial.into());
}

/// Makes the self-signed CA of a cluster, valid about ten years.
pub fn generate_ca(cluster_name: &str) -> anyhow::Result<PemPair> {
    let key = KeyPair::generate().context("generate CA key")?;
    let mut params = CertificateParams::new(Vec::<String>::new()).context("build CA parameters")?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("corral CA {cluster_name}"));
    dn.push(DnType::OrganizationName, format!("corral cluster {cluster_name}"));
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    validity(&mut params, CA_VALIDITY_DAYS);
    new_serial(&mut params, cluster_name.as_bytes());
    let cert = params.self_signed(&key).context("self-sign CA certificate")?;
    Ok(PemPair { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
}

fn leaf(ca: &PemPair, common_name: &str, sans: Vec<SanType>, ekus: Vec<ExtendedKeyUsagePurpose>) -> anyhow::Result<PemPair> {
    let ca_key = KeyPair::from_pem(&ca.key_pem).context("parse CA key")?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, &ca_key).context("parse CA certificate")?;
    let key = KeyPair::generate().context("generate key")?;
    let mut params = CertificateParams::new(Vec::<String>::new()).context("build certificate parameters")?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    params.distinguished_name = dn;
    params.subject_alt_names = sans;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = ekus;
    params.use_authority_key_identifier_extension = true;
    validity(&mut params, LEAF_VALIDITY_DAYS);
    new_serial(&mut params, common_name.as_bytes());
    let cert = params.signed_by(&key, &issuer).with_context(|| format!("sign certificate for {common_name}"))?;
    Ok(PemPair { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
}

fn dns_san(name: &str) -> anyhow::Result<SanType> {
    let ia5 = name.to_string().try_into().with_context(|| format!("use '{name}' as a DNS name"))?;
    Ok(SanType::DnsName(ia5))
}

/// Issues a node's certificate: good for serving and for dialing other nodes. Names
/// `corral.cluster`, the node's name and each of `hosts` (IP addresses as IP names).
pub fn issue_node_cert(ca: &PemPair, node_name: &str, hosts: &[String]) -> anyhow::Result<PemPair> {
    if node_name.is_empty() {
        bail!("a node needs a non-empty name");
    }
    let sans = node_sans(node_name, hosts)?;
    leaf(ca, node_name, sans, vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth])
}

/// The SANs a node certificate carries: `corral.cluster`, the node's name, each of `hosts`.
fn node_sans(node_name: &str, hosts: &[String]) -> anyhow::Result<Vec<SanType>> {
    let mut sans = vec![dns_san(SERVER_NAME)?];
    let mut push = |san: SanType| {
        if !sans.contains(&san) {
            sans.push(san);
        }
    };
    push(dns_san(node_name)?);
    for host in hosts {
        let host = host.trim().trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            continue;
        }
        match host.parse::<IpAddr>() {
            Ok(ip) => push(SanType::IpAddress(ip)),
            Err(_) => push(dns_san(host)?),
        }
    }
    Ok(sans)
}

/// Most names a node may ask for in its certificate.
pub const NODE_HOSTS_MAX: usize = 32;

/// A key and a certificate signing request for node `node_name` reachable as `hosts`: what a
/// machine sends to enrol with a join token alone. The key never leaves it.
pub fn node_csr(node_name: &str, hosts: &[String]) -> anyhow::Result<PemPair> {
    let key = KeyPair::generate().context("generate key")?;
    let mut params = CertificateParams::new(Vec::<String>::new()).context("build request parameters")?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, node_name);
    params.distinguished_name = dn;
    params.subject_alt_names = node_sans(node_name, hosts)?;
    let csr = params.serialize_request(&key).context("sign the certificate request")?;
    Ok(PemPair { cert_pem: csr.pem().context("encode the certificate request")?, key_pem: key.serialize_pem() })
}

/// Signs a node's certificate request with the cluster CA: the common name is `node_name`
/// whatever the request says; of its names only DNS names and IP addresses are kept (at most
/// [`NODE_HOSTS_MAX`]), plus `corral.cluster` and the node's name.
pub fn sign_node_csr(ca: &PemPair, csr_pem: &str, node_name: &str) -> anyhow::Result<String> {
    if node_name.is_empty() {
        bail!("a node needs a non-empty name");
    }
    let ca_key = KeyPair::from_pem(&ca.key_pem).context("parse CA key")?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, &ca_key).context("parse CA certificate")?;
    let mut csr = rcgen::CertificateSigningRequestParams::from_pem(csr_pem).context("parse the certificate request")?;
    let hosts: Vec<String> = csr
        .params
        .subject_alt_names
        .iter()
        .filter_map(|san| match san {
            SanType::DnsName(n) => Some(n.as_str().to_string()),
            SanType::IpAddress(ip) => Some(ip.to_string()),
            _ => None,
        })
        .collect();
    if hosts.len() > NODE_HOSTS_MAX {
        bail!("the request names {} hosts; at most {NODE_HOSTS_MAX}", hosts.len());
    }
    let mut params = CertificateParams::new(Vec::<String>::new()).context("build certificate parameters")?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, node_name);
    params.distinguished_name = dn;
    params.subject_alt_names = node_sans(node_name, &hosts)?;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    validity(&mut params, LEAF_VALIDITY_DAYS);
    new_serial(&mut params, node_name.as_bytes());
    csr.params = params;
    let cert = csr.signed_by(&issuer).with_context(|| format!("sign the certificate of {node_name}"))?;
    Ok(cert.pem())
}

/// The host names and addresses a node certificate names besides `corral.cluster` and the
/// node's own name: what its renewal asks for again.
pub fn cert_hosts(cert_pem: &str) -> anyhow::Result<Vec<String>> {
    let der = first_cert_der(cert_pem)?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).map_err(|e| anyhow!("parse certificate: {e}"))?;
    let cn = common_name_of(&der).unwrap_or_default();
    let mut hosts = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                x509_parser::extensions::GeneralName::DNSName(n) if *n != SERVER_NAME && *n != cn => hosts.push(n.to_string()),
                x509_parser::extensions::GeneralName::IPAddress(b) => match b.len() {
                    4 => hosts.push(IpAddr::from(<[u8; 4]>::try_from(*b).unwrap_or_default()).to_string()),
                    16 => hosts.push(IpAddr::from(<[u8; 16]>::try_from(*b).unwrap_or_default()).to_string()),
                    _ => {}
                },
                _ => {}
            }
        }
    }
    Ok(hosts)
}

/// When the first certificate in `cert_pem` expires, in Unix seconds.
pub fn not_after_unix(cert_pem: &str) -> anyhow::Result<i64> {
    let der = first_cert_der(cert_pem)?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).map_err(|e| anyhow!("parse certificate: {e}"))?;
    Ok(cert.validity().not_after.timestamp())
}

/// Hex SHA-256 of a certificate's DER (of the first certificate in `cert_pem`).
pub fn cert_fingerprint(cert_pem: &str) -> anyhow::Result<String> {
    Ok(der_fingerprint(&first_cert_der(cert_pem)?))
}

/// Issues a user's client certificate, common name `user:<user>`.
pub fn issue_client_cert(ca: &PemPair, user: &str) -> anyhow::Result<PemPair> {
    if user.is_empty() {
        bail!("a user needs a non-empty name");
    }
    leaf(ca, &format!("{USER_CN_PREFIX}{user}"), Vec::new(), vec![ExtendedKeyUsagePurpose::ClientAuth])
}

fn first_cert_der(cert_pem: &str) -> anyhow::Result<CertificateDer<'static>> {
    CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|e| anyhow!("parse PEM certificate: {e}"))
}

/// Hex SHA-256 of the DER of a certificate: what an operator compares to trust a CA.
pub fn ca_fingerprint(ca_cert_pem: &str) -> anyhow::Result<String> {
    let der = first_cert_der(ca_cert_pem).context("read CA certificate")?;
    Ok(der_fingerprint(&der))
}

pub fn der_fingerprint(der: &[u8]) -> String {
    hex::encode(Sha256::digest(der))
}

/// Writes `stem.crt` and `stem.key` into `dir` (made if missing); the key is readable by its
/// owner only.
pub fn write_pem_pair(dir: &Path, stem: &str, pair: &PemPair) -> anyhow::Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("create directory {}", dir.display()))?;
    let cert_path = dir.join(format!("{stem}.crt"));
    fs::write(&cert_path, &pair.cert_pem).with_context(|| format!("write certificate at {}", cert_path.display()))?;
    let key_path = dir.join(format!("{stem}.key"));
    write_private(&key_path, pair.key_pem.as_bytes()).with_context(|| format!("write key at {}", key_path.display()))
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        options.mode(0o600);
        let mut file = options.open(path)?;
        // The mode above only applies to a new file; an old one keeps its bits unless told.
        file.set_permissions(fs::Permissions::from_mode(0o600))?;
        file.write_all(bytes)?;
        file.sync_all()
    }
    #[cfg(not(unix))]
    {
        let mut file = options.open(path)?;
        file.write_all(bytes)?;
        file.sync_all()
    }
}

/// Where a process finds its CA certificate, its own certificate and its key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TlsPaths {
    pub ca_cert: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TlsPaths {
    pub fn load(&self) -> anyhow::Result<TlsIdentity> {
        let ca = fs::read_to_string(&self.ca_cert).with_context(|| format!("read CA certificate at {}", self.ca_cert.display()))?;
        let cert = fs::read_to_string(&self.cert).with_context(|| format!("read certificate at {}", self.cert.display()))?;
        let key = fs::read_to_string(&self.key).with_context(|| format!("read key at {}", self.key.display()))?;
        TlsIdentity::from_pems(&ca, &cert, &key).with_context(|| {
            format!("load TLS identity from {}, {} and {}", self.ca_cert.display(), self.cert.display(), self.key.display())
        })
    }
}

/// What a process proves and trusts: the cluster CA (the only root), its own certificate chain
/// (leaf first) and the leaf's private key.
pub struct TlsIdentity {
    pub(crate) ca_der: CertificateDer<'static>,
    pub(crate) chain: Vec<CertificateDer<'static>>,
    pub(crate) key: PrivateKeyDer<'static>,
}

impl Clone for TlsIdentity {
    fn clone(&self) -> Self {
        TlsIdentity { ca_der: self.ca_der.clone(), chain: self.chain.clone(), key: self.key.clone_key() }
    }
}

impl fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsIdentity")
            .field("common_name", &self.common_name())
            .field("ca_fingerprint", &self.ca_fingerprint())
            .field("key", &"[elided]")
            .finish()
    }
}

impl TlsIdentity {
    /// Parses the three PEMs and checks that the key belongs to the certificate.
    pub fn from_pems(ca_cert_pem: &str, cert_pem: &str, key_pem: &str) -> anyhow::Result<Self> {
        let ca_der = first_cert_der(ca_cert_pem).context("read CA certificate")?;
        let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow!("parse PEM certificate: {e}"))?;
        if chain.is_empty() {
            bail!("no certificate in the certificate PEM");
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| anyhow!("parse PEM key: {e}"))?;
        let provider = crate::crypto_provider();
        rustls::sign::CertifiedKey::from_der(chain.clone(), key.clone_key(), &provider)
            .map_err(|e| anyhow!("check key against certificate: {e}"))?;
        if common_name_of(&ca_der).is_none() {
            bail!("CA certificate is not a readable X.509 certificate");
        }
        Ok(TlsIdentity { ca_der, chain, key })
    }

    /// The common name of this identity's own certificate (its hex fingerprint when it has none).
    pub fn common_name(&self) -> String {
        match self.chain.first() {
            Some(leaf) => peer_name(leaf),
            None => String::new(),
        }
    }

    /// Hex SHA-256 of this identity's own certificate.
    pub fn fingerprint(&self) -> String {
        self.chain.first().map(|c| der_fingerprint(c)).unwrap_or_default()
    }

    /// Hex SHA-256 of the cluster CA's DER, as [`ca_fingerprint`] gives it.
    pub fn ca_fingerprint(&self) -> String {
        der_fingerprint(&self.ca_der)
    }
}

/// The common name in a certificate's subject, if it parses and has one.
pub(crate) fn common_name_of(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}

/// How a peer is named: the certificate's common name, else `sha256:<hex fingerprint>`.
pub(crate) fn peer_name(der: &[u8]) -> String {
    common_name_of(der).unwrap_or_else(|| format!("sha256:{}", der_fingerprint(der)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_fingerprint_is_stable_and_distinct() {
        let ca = generate_ca("test").expect("generate CA");
        let first = ca_fingerprint(&ca.cert_pem).expect("fingerprint");
        assert_eq!(first.len(), 64);
        assert_eq!(first, ca_fingerprint(&ca.cert_pem).expect("fingerprint again"));
        let other = generate_ca("test").expect("generate second CA");
        assert_ne!(first, ca_fingerprint(&other.cert_pem).expect("fingerprint other"));
        assert!(ca_fingerprint("not a pem").is_err());
    }

    #[test]
    fn issued_certificates_carry_names() {
        let ca = generate_ca("test").expect("generate CA");
        let node = issue_node_cert(&ca, "gpu-01", &["127.0.0.1".into(), "gpu-01.lan".into(), "[::1]".into()]).expect("issue node cert");
        let id = TlsIdentity::from_pems(&ca.cert_pem, &node.cert_pem, &node.key_pem).expect("node identity");
        assert_eq!(id.common_name(), "gpu-01");
        assert_eq!(id.ca_fingerprint(), ca_fingerprint(&ca.cert_pem).expect("fingerprint"));

        let user = issue_client_cert(&ca, "alice").expect("issue client cert");
        let id = TlsIdentity::from_pems(&ca.cert_pem, &user.cert_pem, &user.key_pem).expect("user identity");
        assert_eq!(id.common_name(), "user:alice");

        // A key that is not the certificate's is refused.
        assert!(TlsIdentity::from_pems(&ca.cert_pem, &user.cert_pem, &node.key_pem).is_err());
        assert!(issue_client_cert(&ca, "").is_err());
    }

    #[test]
    fn a_signed_request_names_the_node_whatever_it_asked() {
        let ca = generate_ca("test").expect("generate CA");
        let req = node_csr("gpu-07", &["10.0.0.7".into(), "gpu-07.lan".into()]).expect("csr");
        let cert = sign_node_csr(&ca, &req.cert_pem, "gpu-07").expect("sign");
        let id = TlsIdentity::from_pems(&ca.cert_pem, &cert, &req.key_pem).expect("the signed certificate goes with the request's key");
        assert_eq!(id.common_name(), "gpu-07");
        // A request for another name gets the name the signer decided.
        let other = sign_node_csr(&ca, &req.cert_pem, "gpu-08").expect("sign");
        let id = TlsIdentity::from_pems(&ca.cert_pem, &other, &req.key_pem).expect("identity");
        assert_eq!(id.common_name(), "gpu-08");
        assert!(sign_node_csr(&ca, "not a request", "x").is_err());
        assert_eq!(cert_hosts(&cert).expect("hosts"), vec!["10.0.0.7".to_string(), "gpu-07.lan".to_string()]);
        let left = not_after_unix(&cert).expect("expiry") - OffsetDateTime::now_utc().unix_timestamp();
        assert!((364 * 86_400..=366 * 86_400).contains(&left), "{left}");
        assert_eq!(cert_fingerprint(&cert).expect("fingerprint").len(), 64);
    }

    #[test]
    fn pem_pair_round_trips_through_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = generate_ca("files").expect("generate CA");
        let node = issue_node_cert(&ca, "n1", &[]).expect("issue");
        write_pem_pair(dir.path(), "ca", &ca).expect("write ca");
        write_pem_pair(dir.path(), "node", &node).expect("write node");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(dir.path().join("node.key")).expect("stat key").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let paths = TlsPaths { ca_cert: dir.path().join("ca.crt"), cert: dir.path().join("node.crt"), key: dir.path().join("node.key") };
        let id = paths.load().expect("load");
        assert_eq!(id.common_name(), "n1");

        let missing = TlsPaths { ca_cert: dir.path().join("nope.crt"), ..paths };
        let err = format!("{:#}", missing.load().expect_err("missing CA"));
        assert!(err.contains("read CA certificate at"), "{err}");
    }
}
