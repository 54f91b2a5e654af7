//! Who may call what on a Crescent cluster in token mode.
//!
//! Owns the three roles — client (engines and stores), admin (operators and
//! `crescentctl`), peer (the other masters) — the bearer tokens that prove
//! them, read from files so they never show in `ps`, their constant-time
//! comparison, the one table of which gRPC method needs which role
//! ([`role_for_grpc_path`]), and the interceptor a client attaches its
//! token (and the current request id) with ([`BearerToken`]). Servers
//! check with [`Verifier`].
//!
//! It must not hold any other policy, open sockets or know the metadata;
//! where a check is enforced (the master's gRPC layer and admin HTTP) is the
//! master's business. Mutual TLS material and the one place gRPC endpoints
//! are built are in [`tls`]. Data-plane capabilities (signed by masters,
//! checked by stores) are in [`capability`].

pub mod capability;
pub mod tls;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use rand::RngCore;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// Shortest token accepted from a file: a guessable token is no token.
pub const MIN_TOKEN_LEN: usize = 16;
/// Longest token accepted (a header, not a document).
pub const MAX_TOKEN_LEN: usize = 1024;
/// Most tokens one file may list (a rotation needs two).
pub const MAX_TOKENS_PER_FILE: usize = 4;

/// The files `crescentctl tokens init` writes, one per role.
pub const CLIENT_TOKEN_FILE: &str = "client.token";
pub const ADMIN_TOKEN_FILE: &str = "admin.token";
pub const CLUSTER_TOKEN_FILE: &str = "cluster.token";

/// What a caller may do. Each role includes the ones before it: an admin
/// may do what a client may, a peer master what an admin may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Puts, gets, segments and heartbeats: engines and stores.
    Client,
    /// Membership, leadership transfer, wiping keys, listing keys and segments.
    Admin,
    /// Raft traffic and TimeoutNow between masters.
    Peer,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Client => "client",
            Role::Admin => "admin",
            Role::Peer => "peer-master",
        })
    }
}

/// The role each gRPC method needs. Unknown paths need [`Role::Peer`], so a
/// method added without an entry here is closed, not open.
pub fn role_for_grpc_path(path: &str) -> Role {
    let Some((service, method)) = path.strip_prefix('/').and_then(|p| p.split_once('/')) else {
        return Role::Peer;
    };
    if method.contains('/') {
        return Role::Peer;
    }
    match (service, method) {
        ("crescent.MasterService", "RemoveAll" | "RemoveByRegex") => Role::Admin,
        ("crescent.MasterService", _) => Role::Client,
        ("crescent.ClusterService", "GetLeader" | "ListMembers" | "GetStatus") => Role::Client,
        ("crescent.ClusterService", "AddMember" | "RemoveMember" | "TransferLeader") => Role::Admin,
        _ => Role::Peer,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("cannot read token file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("token file {path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("cannot write token file {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the {0} and {1} tokens are the same; each role needs its own token")]
    Reused(Role, Role),
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    #[error("no credentials: this cluster needs a token (header `authorization: Bearer <token>`; clients read it from --token-file or CRESCENT_TOKEN_FILE)")]
    Missing,
    #[error("the token presented is not valid for this cluster")]
    Unknown,
    #[error("this needs the {needed} role; the token presented grants {granted}")]
    Insufficient { needed: Role, granted: Role },
}

impl From<Denied> for tonic::Status {
    fn from(d: Denied) -> Self {
        match d {
            Denied::Missing | Denied::Unknown => tonic::Status::unauthenticated(d.to_string()),
            Denied::Insufficient { .. } => tonic::Status::permission_denied(d.to_string()),
        }
    }
}

/// A token held in memory. Its `Debug` hides it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    fn matches(&self, presented: &[u8]) -> bool {
        constant_time_eq(self.0.as_bytes(), presented)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Equality whose time depends on the lengths only, not on where the
/// inputs first differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u64;
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= u64::from(x ^ y);
    }
    diff == 0
}

/// Checks a token's text: what a file may hold and a header may carry.
pub fn validate_token(token: &str) -> Result<(), String> {
    if token.len() < MIN_TOKEN_LEN {
        return Err(format!(
            "a token needs at least {MIN_TOKEN_LEN} characters, this one has {}",
            token.len()
        ));
    }
    if token.len() > MAX_TOKEN_LEN {
        return Err(format!(
            "a token may have at most {MAX_TOKEN_LEN} characters, this one has {}",
            token.len()
        ));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("a token may hold printable ASCII only, without spaces".into());
    }
    Ok(())
}

/// Reads a token file: one token per line (blank lines and `#` comments
/// ignored), at most [`MAX_TOKENS_PER_FILE`]. A server accepts every token
/// listed; a client presents the first. Two lines make a rotation without
/// downtime: new first, old second, then the old one removed.
pub fn read_token_file(path: &Path) -> Result<Vec<Secret>, AuthError> {
    let invalid = |reason: String| AuthError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|source| AuthError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mut tokens = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        validate_token(line).map_err(invalid)?;
        tokens.push(Secret(line.to_string()));
    }
    if tokens.is_empty() {
        return Err(invalid("it holds no token".into()));
    }
    if tokens.len() > MAX_TOKENS_PER_FILE {
        return Err(invalid(format!(
            "it lists {} tokens; at most {MAX_TOKENS_PER_FILE} are accepted",
            tokens.len()
        )));
    }
    Ok(tokens)
}

/// A new random token: 32 bytes from the OS generator, hex.
pub fn generate_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes a fresh token for each role into `dir` ([`CLIENT_TOKEN_FILE`],
/// [`ADMIN_TOKEN_FILE`], [`CLUSTER_TOKEN_FILE`]), readable by the owner
/// only. Existing files are kept unless `overwrite`.
pub fn write_token_files(dir: &Path, overwrite: bool) -> Result<Vec<PathBuf>, AuthError> {
    let write_err = |path: &Path, source| AuthError::Write {
        path: path.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(|e| write_err(dir, e))?;
    let mut written = Vec::new();
    for name in [CLIENT_TOKEN_FILE, ADMIN_TOKEN_FILE, CLUSTER_TOKEN_FILE] {
        let path = dir.join(name);
        if path.exists() && !overwrite {
            continue;
        }
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&path).map_err(|e| write_err(&path, e))?;
        std::io::Write::write_all(&mut file, format!("{}\n", generate_token()).as_bytes())
            .map_err(|e| write_err(&path, e))?;
        written.push(path);
    }
    Ok(written)
}

/// The server side: which presented token grants which role.
#[derive(Debug)]
pub struct Verifier {
    /// `None`: `--insecure`, everything is allowed.
    tokens: Option<RwLock<Tokens>>,
    /// Where the tokens came from, for [`reload`](Self::reload).
    files: Option<[PathBuf; 3]>,
    denied: AtomicU64,
}

/// Every token a role accepts (a file may list several while rotating).
#[derive(Debug)]
struct Tokens {
    client: Vec<Secret>,
    admin: Vec<Secret>,
    peer: Vec<Secret>,
}

impl Tokens {
    fn new(client: Vec<Secret>, admin: Vec<Secret>, peer: Vec<Secret>) -> Result<Self, AuthError> {
        let shared = |a: &[Secret], b: &[Secret]| a.iter().any(|x| b.contains(x));
        if shared(&client, &admin) {
            return Err(AuthError::Reused(Role::Client, Role::Admin));
        }
        if shared(&client, &peer) {
            return Err(AuthError::Reused(Role::Client, Role::Peer));
        }
        if shared(&admin, &peer) {
            return Err(AuthError::Reused(Role::Admin, Role::Peer));
        }
        Ok(Self {
            client,
            admin,
            peer,
        })
    }

    fn read(files: &[PathBuf; 3]) -> Result<Self, AuthError> {
        Self::new(
            read_token_file(&files[0])?,
            read_token_file(&files[1])?,
            read_token_file(&files[2])?,
        )
    }

    /// The highest role `presented` proves. Every comparison runs, so the
    /// time taken does not say which token matched.
    fn role_of(&self, presented: &[u8]) -> Option<Role> {
        let matches = |set: &[Secret]| {
            set.iter()
                .fold(false, |found, s| s.matches(presented) | found)
        };
        let (peer, admin, client) = (
            matches(&self.peer),
            matches(&self.admin),
            matches(&self.client),
        );
        if peer {
            Some(Role::Peer)
        } else if admin {
            Some(Role::Admin)
        } else if client {
            Some(Role::Client)
        } else {
            None
        }
    }
}

impl Verifier {
    /// No checks at all (`--insecure`).
    pub fn insecure() -> Self {
        Self {
            tokens: None,
            files: None,
            denied: AtomicU64::new(0),
        }
    }

    /// Token mode. No token may serve two roles, or one role's token would
    /// grant another's.
    pub fn with_tokens(client: Secret, admin: Secret, peer: Secret) -> Result<Self, AuthError> {
        Ok(Self {
            tokens: Some(RwLock::new(Tokens::new(
                vec![client],
                vec![admin],
                vec![peer],
            )?)),
            files: None,
            denied: AtomicU64::new(0),
        })
    }

    /// Token mode from the three files (each may list several tokens).
    pub fn from_files(client: &Path, admin: &Path, peer: &Path) -> Result<Self, AuthError> {
        let files = [
            client.to_path_buf(),
            admin.to_path_buf(),
            peer.to_path_buf(),
        ];
        Ok(Self {
            tokens: Some(RwLock::new(Tokens::read(&files)?)),
            files: Some(files),
            denied: AtomicU64::new(0),
        })
    }

    /// Reads the token files again (on SIGHUP). On any error the tokens in
    /// use stay, and the error says what is wrong; `Ok(false)`: nothing to
    /// reload (`--insecure`, or tokens not from files).
    pub fn reload(&self) -> Result<bool, AuthError> {
        let (Some(tokens), Some(files)) = (&self.tokens, &self.files) else {
            return Ok(false);
        };
        let fresh = Tokens::read(files)?;
        *tokens.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        Ok(true)
    }

    pub fn is_insecure(&self) -> bool {
        self.tokens.is_none()
    }

    /// The tag a master writes beside its address when it registers in etcd
    /// (token mode; `None` with `--insecure`): an HMAC-SHA256 keyed with the
    /// cluster token it presents, over the cluster name, its id and address.
    /// Without it, anyone who can write to etcd could register a master the
    /// leader would add, and send the cluster token to.
    pub fn member_tag(&self, cluster: &str, id: u64, addr: &str) -> Option<String> {
        let tokens = self.tokens.as_ref()?;
        let tokens = tokens.read().unwrap_or_else(|e| e.into_inner());
        tokens
            .peer
            .first()
            .map(|t| member_mac(t, cluster, id, addr))
    }

    /// Whether `tag` is [`member_tag`](Self::member_tag) under any cluster
    /// token this master accepts (always true with `--insecure`).
    pub fn member_tag_ok(&self, cluster: &str, id: u64, addr: &str, tag: &str) -> bool {
        let Some(tokens) = &self.tokens else {
            return true;
        };
        let tokens = tokens.read().unwrap_or_else(|e| e.into_inner());
        tokens.peer.iter().fold(false, |ok, t| {
            constant_time_eq(member_mac(t, cluster, id, addr).as_bytes(), tag.as_bytes()) | ok
        })
    }

    /// Requests refused so far.
    pub fn denied_total(&self) -> u64 {
        self.denied.load(Ordering::Relaxed)
    }

    /// Checks an `authorization` header value (`Bearer <token>`) against
    /// the role `needed`.
    pub fn check(&self, authorization: Option<&[u8]>, needed: Role) -> Result<(), Denied> {
        let result = self.check_quietly(authorization, needed);
        if result.is_err() {
            self.denied.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// [`check`](Self::check) on gRPC metadata.
    pub fn check_metadata(&self, metadata: &MetadataMap, needed: Role) -> Result<(), Denied> {
        self.check(metadata.get("authorization").map(|v| v.as_bytes()), needed)
    }

    fn check_quietly(&self, authorization: Option<&[u8]>, needed: Role) -> Result<(), Denied> {
        let Some(tokens) = &self.tokens else {
            return Ok(());
        };
        let presented = authorization
            .and_then(bearer_token)
            .ok_or(Denied::Missing)?;
        let granted = tokens
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .role_of(presented)
            .ok_or(Denied::Unknown)?;
        if granted >= needed {
            Ok(())
        } else {
            Err(Denied::Insufficient { needed, granted })
        }
    }
}

fn member_mac(token: &Secret, cluster: &str, id: u64, addr: &str) -> String {
    use hmac::Mac;
    // HMAC accepts keys of any length, so this cannot fail.
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(token.0.as_bytes())
        .expect("HMAC takes keys of any length");
    mac.update(format!("crescent-member\n{cluster}\n{id}\n{addr}").as_bytes());
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The token of an `authorization: Bearer <token>` value, if it is one.
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let prefix = b"bearer ";
    if value.len() <= prefix.len() || !value[..prefix.len()].eq_ignore_ascii_case(prefix) {
        return None;
    }
    Some(value[prefix.len()..].trim_ascii())
}

/// The client side: attaches `authorization: Bearer <token>` to every call
/// made through it; without a token it attaches nothing (for `--insecure`
/// clusters).
/// Clones share the token, so a [`reload`](BearerToken::reload) reaches
/// every channel made from any of them.
#[derive(Clone, Default)]
pub struct BearerToken {
    header: Arc<RwLock<Option<AsciiMetadataValue>>>,
    /// The file it came from, for `reload`.
    file: Option<PathBuf>,
}

impl fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.is_set() {
            "BearerToken(..)"
        } else {
            "BearerToken(none)"
        })
    }
}

fn header_of(secret: &Secret) -> Option<AsciiMetadataValue> {
    // A Secret passed validate_token, so it is a valid header value; the
    // fallback keeps this total anyway.
    AsciiMetadataValue::try_from(format!("Bearer {}", secret.0)).ok()
}

/// A channel whose calls carry a [`BearerToken`].
pub type AuthedChannel = InterceptedService<Channel, BearerToken>;

impl BearerToken {
    /// No token: for clusters started with `--insecure`.
    pub fn none() -> Self {
        Self::default()
    }

    pub fn new(secret: &Secret) -> Self {
        Self {
            header: Arc::new(RwLock::new(header_of(secret))),
            file: None,
        }
    }

    /// The first token `path` lists.
    pub fn from_file(path: &Path) -> Result<Self, AuthError> {
        let tokens = read_token_file(path)?;
        Ok(Self {
            header: Arc::new(RwLock::new(header_of(&tokens[0]))),
            file: Some(path.to_path_buf()),
        })
    }

    /// Reads the file again (on SIGHUP); on error the token in use stays.
    /// `Ok(false)`: not from a file.
    pub fn reload(&self) -> Result<bool, AuthError> {
        let Some(file) = &self.file else {
            return Ok(false);
        };
        let tokens = read_token_file(file)?;
        *self.header.write().unwrap_or_else(|e| e.into_inner()) = header_of(&tokens[0]);
        Ok(true)
    }

    fn current(&self) -> Option<AsciiMetadataValue> {
        self.header
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// From an optional file (`None`: no token).
    pub fn from_optional_file(path: Option<&Path>) -> Result<Self, AuthError> {
        path.map(Self::from_file)
            .transpose()
            .map(Option::unwrap_or_default)
    }

    pub fn is_set(&self) -> bool {
        self.current().is_some()
    }

    /// The header value, for HTTP requests.
    pub fn header_value(&self) -> Option<String> {
        self.current()
            .and_then(|v| v.to_str().ok().map(str::to_string))
    }

    /// `channel` with this token on every call.
    pub fn wrap(&self, channel: Channel) -> AuthedChannel {
        InterceptedService::new(channel, self.clone())
    }
}

impl tonic::service::Interceptor for BearerToken {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(header) = self.current() {
            request.metadata_mut().insert("authorization", header);
        }
        // The call's request id rides along so the master logs under it.
        if let Some(id) = crescent_proto::request_id::current() {
            if let Ok(value) = AsciiMetadataValue::try_from(id.to_string()) {
                request
                    .metadata_mut()
                    .insert(crescent_proto::request_id::HEADER, value);
            }
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(s: &str) -> Secret {
        Secret(s.to_string())
    }

    fn verifier() -> Verifier {
        Verifier::with_tokens(
            secret("client-token-0123456789"),
            secret("admin-token-0123456789"),
            secret("peer-token-0123456789"),
        )
        .unwrap()
    }

    #[test]
    fn each_token_grants_its_role_and_the_ones_below() {
        let v = verifier();
        let client = Some(b"Bearer client-token-0123456789".as_slice());
        let admin = Some(b"bearer admin-token-0123456789".as_slice());
        let peer = Some(b"Bearer peer-token-0123456789".as_slice());
        assert_eq!(v.check(client, Role::Client), Ok(()));
        assert_eq!(
            v.check(client, Role::Admin),
            Err(Denied::Insufficient {
                needed: Role::Admin,
                granted: Role::Client
            })
        );
        assert!(v.check(client, Role::Peer).is_err());
        assert_eq!(v.check(admin, Role::Client), Ok(()));
        assert_eq!(v.check(admin, Role::Admin), Ok(()));
        assert!(v.check(admin, Role::Peer).is_err());
        assert_eq!(v.check(peer, Role::Peer), Ok(()));
        assert_eq!(v.denied_total(), 3);
    }

    #[test]
    fn missing_malformed_and_wrong_tokens_are_refused() {
        let v = verifier();
        assert_eq!(v.check(None, Role::Client), Err(Denied::Missing));
        assert_eq!(
            v.check(Some(b"client-token-0123456789"), Role::Client),
            Err(Denied::Missing),
            "without the Bearer scheme"
        );
        assert_eq!(
            v.check(Some(b"Bearer "), Role::Client),
            Err(Denied::Missing)
        );
        assert_eq!(
            v.check(Some(b"Bearer x"), Role::Client),
            Err(Denied::Unknown)
        );
        assert_eq!(
            v.check(Some(b"Bearer client-token-012345678"), Role::Client),
            Err(Denied::Unknown),
            "a prefix of the token"
        );
        assert_eq!(
            v.check(Some(b"Bearer client-token-01234567890"), Role::Client),
            Err(Denied::Unknown),
            "the token and more"
        );
        let status: tonic::Status = Denied::Unknown.into();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
    }

    #[test]
    fn member_tags_bind_cluster_id_and_address_to_the_cluster_token() {
        let v = verifier();
        let tag = v.member_tag("c", 2, "10.0.0.2:50051").unwrap();
        assert!(v.member_tag_ok("c", 2, "10.0.0.2:50051", &tag));
        assert!(
            !v.member_tag_ok("c", 2, "10.6.6.6:50051", &tag),
            "other address"
        );
        assert!(
            !v.member_tag_ok("c", 99, "10.0.0.2:50051", &tag),
            "other id"
        );
        assert!(
            !v.member_tag_ok("d", 2, "10.0.0.2:50051", &tag),
            "other cluster"
        );
        assert!(!v.member_tag_ok("c", 2, "10.0.0.2:50051", ""), "no tag");
        let other = Verifier::with_tokens(
            secret("client-token-0123456789"),
            secret("admin-token-0123456789"),
            secret("another-peer-token-0123"),
        )
        .unwrap();
        assert!(
            !other.member_tag_ok("c", 2, "10.0.0.2:50051", &tag),
            "other token"
        );
        assert_eq!(Verifier::insecure().member_tag("c", 2, "a:1"), None);
        assert!(Verifier::insecure().member_tag_ok("c", 2, "a:1", ""));
    }

    #[test]
    fn insecure_allows_everything() {
        let v = Verifier::insecure();
        assert!(v.is_insecure());
        assert_eq!(v.check(None, Role::Peer), Ok(()));
    }

    #[test]
    fn one_token_for_two_roles_is_refused() {
        let same = secret("same-token-0123456789");
        assert!(matches!(
            Verifier::with_tokens(same.clone(), same, secret("peer-token-0123456789")),
            Err(AuthError::Reused(Role::Client, Role::Admin))
        ));
    }

    #[test]
    fn the_method_table_closes_what_it_does_not_name() {
        assert_eq!(
            role_for_grpc_path("/crescent.MasterService/PutStart"),
            Role::Client
        );
        assert_eq!(
            role_for_grpc_path("/crescent.MasterService/RemoveAll"),
            Role::Admin
        );
        assert_eq!(
            role_for_grpc_path("/crescent.MasterService/RemoveByRegex"),
            Role::Admin
        );
        assert_eq!(
            role_for_grpc_path("/crescent.ClusterService/GetLeader"),
            Role::Client
        );
        assert_eq!(
            role_for_grpc_path("/crescent.ClusterService/AddMember"),
            Role::Admin
        );
        assert_eq!(
            role_for_grpc_path("/crescent.ClusterService/TransferLeader"),
            Role::Admin
        );
        assert_eq!(
            role_for_grpc_path("/crescent.ClusterService/TimeoutNow"),
            Role::Peer
        );
        assert_eq!(role_for_grpc_path("/crescent.RaftService/Vote"), Role::Peer);
        assert_eq!(
            role_for_grpc_path("/crescent.NewService/Anything"),
            Role::Peer
        );
        assert_eq!(role_for_grpc_path("garbage"), Role::Peer);
        assert_eq!(
            role_for_grpc_path("/crescent.MasterService/RemoveAll/x"),
            Role::Peer
        );
        assert_eq!(
            role_for_grpc_path("crescent.MasterService/PutStart"),
            Role::Peer
        );
    }

    #[test]
    fn token_files_are_validated_and_generated_private() {
        let dir = tempfile::tempdir().unwrap();
        let written = write_token_files(dir.path(), false).unwrap();
        assert_eq!(written.len(), 3);
        assert!(
            write_token_files(dir.path(), false).unwrap().is_empty(),
            "kept"
        );
        let v = Verifier::from_files(
            &dir.path().join(CLIENT_TOKEN_FILE),
            &dir.path().join(ADMIN_TOKEN_FILE),
            &dir.path().join(CLUSTER_TOKEN_FILE),
        )
        .unwrap();
        let client = BearerToken::from_file(&dir.path().join(CLIENT_TOKEN_FILE)).unwrap();
        let header = client.header_value().unwrap().into_bytes();
        assert_eq!(v.check(Some(&header), Role::Client), Ok(()));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&written[0]).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "token files are private");
        }
        // Several tokens: all accepted, the first presented; a reload with a
        // broken file keeps the tokens in use.
        let client_file = dir.path().join(CLIENT_TOKEN_FILE);
        let old = std::fs::read_to_string(&client_file).unwrap();
        let new = generate_token();
        std::fs::write(&client_file, format!("# rotating\n{new}\n\n{old}")).unwrap();
        assert!(v.reload().unwrap());
        assert!(client.reload().unwrap());
        let presented = client.header_value().unwrap();
        assert_eq!(presented, format!("Bearer {new}"));
        let old_header = format!("Bearer {}", old.trim());
        assert_eq!(v.check(Some(old_header.as_bytes()), Role::Client), Ok(()));
        assert_eq!(v.check(Some(presented.as_bytes()), Role::Client), Ok(()));
        std::fs::write(&client_file, "short\n").unwrap();
        assert!(matches!(v.reload(), Err(AuthError::Invalid { .. })));
        assert_eq!(
            v.check(Some(presented.as_bytes()), Role::Client),
            Ok(()),
            "kept"
        );
        std::fs::write(&client_file, format!("{new}\n")).unwrap();
        assert!(v.reload().unwrap());
        assert_eq!(
            v.check(Some(old_header.as_bytes()), Role::Client),
            Err(Denied::Unknown)
        );
        let five: Vec<String> = (0..5).map(|_| generate_token()).collect();
        std::fs::write(&client_file, five.join("\n")).unwrap();
        assert!(matches!(
            read_token_file(&client_file),
            Err(AuthError::Invalid { .. })
        ));
        std::fs::write(&client_file, "# nothing\n\n").unwrap();
        assert!(matches!(
            read_token_file(&client_file),
            Err(AuthError::Invalid { .. })
        ));

        let short = dir.path().join("short");
        std::fs::write(&short, "abc\n").unwrap();
        assert!(matches!(
            read_token_file(&short),
            Err(AuthError::Invalid { .. })
        ));
        let spaced = dir.path().join("spaced");
        std::fs::write(&spaced, "abc def ghi jkl mno pqr").unwrap();
        assert!(matches!(
            read_token_file(&spaced),
            Err(AuthError::Invalid { .. })
        ));
        assert!(matches!(
            read_token_file(&dir.path().join("absent")),
            Err(AuthError::Read { .. })
        ));
    }

    proptest::proptest! {
        #[test]
        fn constant_time_eq_is_equality(a in proptest::collection::vec(0u8..4, 0..8),
                                        b in proptest::collection::vec(0u8..4, 0..8)) {
            proptest::prop_assert_eq!(constant_time_eq(&a, &b), a == b);
        }

        #[test]
        fn no_header_value_panics_or_passes_without_a_token(
            value in proptest::collection::vec(proptest::num::u8::ANY, 0..64)
        ) {
            let v = verifier();
            proptest::prop_assert!(v.check(Some(&value), Role::Client).is_err());
        }
    }
}
