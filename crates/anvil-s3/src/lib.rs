//! S3-compatible object stores (AWS S3, Garage, MinIO, ...) as an [`anvil::device::BlobStore`],
//! so that a volume can live under `s3://BUCKET/PREFIX`.
//!
//! Configuration comes from the usual AWS environment variables and, under them, from the
//! profile they name (`AWS_PROFILE`, else `default`: keys and session token from
//! `~/.aws/credentials`, `region` and `endpoint_url` from `~/.aws/config`, or the files
//! `AWS_SHARED_CREDENTIALS_FILE` and `AWS_CONFIG_FILE` name; no instance metadata):
//! `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_SESSION_TOKEN`, `AWS_REGION` (or `AWS_DEFAULT_REGION`; `us-east-1` when neither),
//! `AWS_ENDPOINT_URL` (or `AWS_ENDPOINT`) for stores other than AWS, `AWS_ALLOW_HTTP=true`
//! for a plain-http endpoint, and the other `AWS_*` keys that `object_store` knows
//! (web identity and container credentials among them). With an endpoint set, requests are
//! path-style (`ENDPOINT/BUCKET/KEY`), which is what Garage and MinIO on an address need.
//!
//! `object_store` is async; each [`S3Store`] owns a small multi-threaded tokio runtime and
//! blocks the calling thread on it, so the trait's methods may be called from any number of
//! threads at once. Calling them from inside another tokio runtime does not panic (the
//! request then runs on this store's runtime and the caller's thread waits for it), but it
//! does block that runtime's worker for the request's length: don't.
//!
//! Every error is an `io::Error` with a one-line message that names the operation, the
//! object and, in user terms, what went wrong: credentials refused, bucket missing, store
//! unreachable, no answer in time. Requests are retried a few times with backoff within
//! [`RETRY_TIMEOUT`]; the caller retries over longer outages.

use anvil::device::BlobStore;
use futures_util::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::client::{HttpError, HttpErrorKind};
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutMode,
    PutOptions, PutPayload, RetryConfig,
};
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

/// How long one HTTP request may take, from connecting to the end of its body.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long connecting to the store may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How many times a failed request is retried (connection errors, 5xx, 429, timeouts of
/// idempotent requests), with exponential backoff from 100 ms up to 2 s.
pub const MAX_RETRIES: usize = 4;
/// No retry starts later than this after the first attempt.
pub const RETRY_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a volume lives: `s3://BUCKET/PREFIX`, the prefix without leading or trailing `/`
/// (empty for the bucket's root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Url {
    pub bucket: String,
    pub prefix: String,
}

impl std::fmt::Display for S3Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.prefix.is_empty() {
            write!(f, "s3://{}", self.bucket)
        } else {
            write!(f, "s3://{}/{}", self.bucket, self.prefix)
        }
    }
}

/// Parses `s3://BUCKET`, `s3://BUCKET/`, `s3://BUCKET/PREFIX/...`: trailing (and doubled
/// leading) slashes of the prefix are dropped; an empty segment inside it is refused.
pub fn parse_url(url: &str) -> Result<S3Url, String> {
    let Some(rest) = url.strip_prefix("s3://") else {
        return Err(format!(
            "{url:?} is not an object-store address: expected s3://BUCKET/PREFIX"
        ));
    };
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(format!(
            "{url:?} names no bucket: expected s3://BUCKET/PREFIX"
        ));
    }
    if let Some(c) = bucket
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')))
    {
        return Err(format!(
            "{url:?}: the bucket name {bucket:?} holds {c:?}; bucket names are letters, digits, '-', '.' and '_'"
        ));
    }
    let prefix = prefix.trim_matches('/');
    if !prefix.is_empty() {
        if prefix.chars().any(char::is_control) {
            return Err(format!("{url:?}: the prefix holds a control character"));
        }
        if prefix.split('/').any(str::is_empty) {
            return Err(format!(
                "{url:?}: the prefix {prefix:?} holds an empty segment (\"//\")"
            ));
        }
        Path::parse(prefix).map_err(|e| {
            format!(
                "{url:?}: the prefix {prefix:?} is not usable: {}",
                one_line(&e)
            )
        })?;
    }
    Ok(S3Url {
        bucket: bucket.to_string(),
        prefix: prefix.to_string(),
    })
}

/// A volume's objects under `s3://BUCKET/PREFIX`. See the crate's documentation for the
/// configuration it reads.
pub struct S3Store {
    url: S3Url,
    /// The endpoint requests go to, for messages.
    endpoint: String,
    client: Arc<AmazonS3>,
    /// `None` only while dropping.
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for S3Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Store")
            .field("url", &self.url.to_string())
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl S3Store {
    /// Opens `s3://BUCKET/PREFIX` with the configuration in this process's environment.
    /// Makes no request: see [`S3Store::check_access`].
    pub fn open(url: &str) -> Result<S3Store, String> {
        S3Store::open_with_vars(url, std::env::vars())
    }

    /// Opens `s3://BUCKET/PREFIX` with the configuration in `vars` (name, value) only, as if
    /// they were the whole environment. Makes no request.
    pub fn open_with_vars<I, K, V>(url: &str, vars: I) -> Result<S3Store, String>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        // reqwest's rustls comes without a provider (Cargo.toml): ring's serves every client
        // of the process. Fails only when one is installed already, which then serves.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let parsed = parse_url(url)?;
        let vars: Vec<(String, String)> = vars
            .into_iter()
            .map(|(k, v)| (k.as_ref().to_string(), v.as_ref().to_string()))
            .collect();
        // A profile's settings first: the variables, read after, win over them.
        let vars: Vec<(String, String)> = profile_vars(&vars)
            .map_err(|e| format!("{parsed}: {e}"))?
            .into_iter()
            .chain(vars)
            .collect();
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(2),
                base: 2.0,
            },
            max_retries: MAX_RETRIES,
            retry_timeout: RETRY_TIMEOUT,
        };
        let options = ClientOptions::new()
            .with_timeout(REQUEST_TIMEOUT)
            .with_connect_timeout(CONNECT_TIMEOUT);
        // Client options first: the AWS_* variables below may refine them (AWS_ALLOW_HTTP).
        let mut builder = AmazonS3Builder::new()
            .with_client_options(options)
            .with_retry(retry);
        let mut seen = Vec::new();
        for (name, value) in &vars {
            let (name, value) = (name.as_str(), value.as_str());
            if !name.starts_with("AWS_") || value.is_empty() {
                continue;
            }
            if let Ok(key) = name.to_ascii_lowercase().parse::<AmazonS3ConfigKey>() {
                builder = builder.with_config(key, value);
                seen.push((name.to_string(), value.to_string()));
            }
        }
        let var = |n: &str| {
            seen.iter()
                .rev()
                .find(|(k, _)| k == n)
                .map(|(_, v)| v.as_str())
        };
        let truthy = |n: &str| {
            var(n).is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes"))
        };
        let has_key = var("AWS_ACCESS_KEY_ID").is_some();
        let has_secret = var("AWS_SECRET_ACCESS_KEY").is_some();
        let other_credentials = truthy("AWS_SKIP_SIGNATURE")
            || var("AWS_WEB_IDENTITY_TOKEN_FILE").is_some()
            || var("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").is_some()
            || var("AWS_CONTAINER_CREDENTIALS_FULL_URI").is_some();
        if has_key != has_secret {
            return Err(format!(
                "{parsed}: {} is set but {} is not",
                if has_key {
                    "AWS_ACCESS_KEY_ID"
                } else {
                    "AWS_SECRET_ACCESS_KEY"
                },
                if has_key {
                    "AWS_SECRET_ACCESS_KEY"
                } else {
                    "AWS_ACCESS_KEY_ID"
                },
            ));
        }
        if !has_key && !other_credentials {
            return Err(format!(
                "{parsed}: no credentials for the object store: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE to a profile in ~/.aws/credentials"
            ));
        }
        let region = builder
            .get_config_value(&AmazonS3ConfigKey::Region)
            .unwrap_or_else(|| "us-east-1".to_string());
        let endpoint = builder
            .get_config_value(&AmazonS3ConfigKey::Endpoint)
            .or_else(|| builder.get_config_value(&AmazonS3ConfigKey::S3Endpoint));
        let endpoint = match endpoint {
            Some(endpoint) => {
                let endpoint = endpoint.trim_end_matches('/').to_string();
                if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
                    return Err(format!(
                        "{parsed}: the endpoint {endpoint:?} is not an http:// or https:// address"
                    ));
                }
                if endpoint.starts_with("http://") && !truthy("AWS_ALLOW_HTTP") {
                    return Err(format!(
                        "{parsed}: the endpoint {endpoint} is plain http: set AWS_ALLOW_HTTP=true to allow it"
                    ));
                }
                // Path-style: ENDPOINT/BUCKET/KEY, as stores on a bare address need.
                builder = builder
                    .with_endpoint(endpoint.clone())
                    .with_virtual_hosted_style_request(false);
                endpoint
            }
            None => format!("https://s3.{region}.amazonaws.com"),
        };
        let client = builder
            .with_bucket_name(parsed.bucket.clone())
            // One DELETE per key (object_store would otherwise send a one-key bulk
            // DeleteObjects POST, which not every store implements alike).
            .with_disable_bulk_delete(true)
            .build()
            .map_err(|e| {
                format!(
                    "{parsed}: cannot configure the object store: {}",
                    one_line(&e)
                )
            })?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("anvil-s3")
            .enable_all()
            .build()
            .map_err(|e| format!("{parsed}: cannot start the object store's runtime: {e}"))?;
        Ok(S3Store {
            url: parsed,
            endpoint,
            client: Arc::new(client),
            runtime: Some(runtime),
        })
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.url.bucket
    }

    /// The volume's prefix in the bucket, without leading or trailing `/` (may be empty).
    pub fn prefix(&self) -> &str {
        &self.url.prefix
    }

    /// The endpoint requests go to (`https://s3.REGION.amazonaws.com` when none is set).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// One cheap request (the first page of a listing of the volume's prefix), to fail early
    /// with a one-line reason: credentials refused, no such bucket, store unreachable.
    pub fn check_access(&self) -> io::Result<()> {
        let client = self.client.clone();
        let prefix = self.dir_path("").unwrap_or(None);
        let first = self.run(async move {
            let mut listing = client.list(prefix.as_ref());
            listing.next().await.transpose()
        })?;
        first.map(|_| ()).map_err(|e| self.error("list", "", e))
    }

    /// The full object path of `key` (relative to the volume's prefix).
    fn path(&self, key: &str) -> io::Result<Path> {
        let refuse = |why: &str| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: object key {key:?} {why}", self.url),
            )
        };
        if key.is_empty() {
            return Err(refuse("is empty"));
        }
        if key.starts_with('/') || key.ends_with('/') || key.contains("//") {
            return Err(refuse("has an empty segment"));
        }
        let full = if self.url.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}/{key}", self.url.prefix)
        };
        Path::parse(&full).map_err(|e| refuse(&format!("is not usable: {}", one_line(&e))))
    }

    /// The path of directory `dir` (relative, no trailing `/`) for listings: `Ok(None)` for
    /// the bucket's root, `Err(())` for a directory no key can be in.
    fn dir_path(&self, dir: &str) -> Result<Option<Path>, ()> {
        let full = match (self.url.prefix.is_empty(), dir.is_empty()) {
            (true, true) => return Ok(None),
            (true, false) => dir.to_string(),
            (false, true) => self.url.prefix.clone(),
            (false, false) => format!("{}/{dir}", self.url.prefix),
        };
        if full.split('/').any(str::is_empty) {
            return Err(());
        }
        Path::parse(full).map(Some).map_err(|_| ())
    }

    /// Runs `future` to completion on this store's runtime.
    fn run<T: Send + 'static>(
        &self,
        future: impl Future<Output = T> + Send + 'static,
    ) -> io::Result<T> {
        // The runtime lives until the store is dropped; a request then is refused, not a panic.
        let runtime = self
            .runtime
            .as_ref()
            .ok_or_else(|| io::Error::other("the object store client is closing"))?;
        if tokio::runtime::Handle::try_current().is_err() {
            // Any number of threads may block on a multi-threaded runtime at once.
            return Ok(runtime.block_on(future));
        }
        // Inside another runtime, where block_on would panic: run the request on ours and
        // wait for its answer.
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        runtime.spawn(async move {
            let _ = tx.send(future.await);
        });
        rx.recv().map_err(|_| {
            io::Error::other(format!(
                "{}: the object store's request task ended without an answer",
                self.url
            ))
        })
    }

    fn describe_key(&self, key: &str) -> String {
        match (self.url.prefix.is_empty(), key.is_empty()) {
            (_, true) => self.url.to_string(),
            (true, false) => format!("s3://{}/{key}", self.url.bucket),
            (false, false) => format!("{}/{key}", self.url),
        }
    }

    /// `e` as a one-line `io::Error` that says what failed in user terms.
    fn error(&self, op: &str, key: &str, e: object_store::Error) -> io::Error {
        let what = format!("{op} {}", self.describe_key(key));
        let text = one_line(&e);
        let code = xml_field(&text, "Code");
        let message = xml_field(&text, "Message");
        let status = status_of(&text);
        let detail = match (&code, &message) {
            (Some(c), Some(m)) => clip(&format!("{c}: {m}")),
            (Some(c), None) => c.clone(),
            (None, _) => match status {
                Some(s) => format!("HTTP {s}"),
                None => innermost(&e),
            },
        };
        let http_kind = http_error_kind(&e);
        let code = code.as_deref().unwrap_or("");
        use io::ErrorKind as K;
        let (kind, message) = if code == "NoSuchBucket" {
            (
                K::Other,
                format!(
                    "{what}: bucket {} does not exist at {}",
                    self.url.bucket, self.endpoint
                ),
            )
        } else if matches!(
            e,
            object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }
        ) {
            (
                K::AlreadyExists,
                format!("{what}: the object already exists"),
            )
        } else if matches!(e, object_store::Error::NotFound { .. }) || code == "NoSuchKey" {
            (K::NotFound, format!("{what}: no such object"))
        } else if matches!(
            e,
            object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. }
        ) || matches!(status, Some(401 | 403))
            || matches!(
                code,
                "InvalidAccessKeyId"
                    | "SignatureDoesNotMatch"
                    | "AccessDenied"
                    | "InvalidToken"
                    | "ExpiredToken"
                    | "AuthorizationHeaderMalformed"
                    | "InvalidSignature"
            )
        {
            (
                K::PermissionDenied,
                format!(
                    "{what}: the object store refused the credentials ({detail}) at {}; check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_REGION",
                    self.endpoint
                ),
            )
        } else if code == "InvalidRange" || status == Some(416) {
            (
                K::UnexpectedEof,
                format!("{what}: the object is shorter than the range asked for"),
            )
        } else if http_kind == Some(HttpErrorKind::Connect) {
            (
                K::ConnectionRefused,
                format!(
                    "{what}: cannot reach the object store at {}: {}",
                    self.endpoint,
                    innermost(&e)
                ),
            )
        } else if matches!(
            http_kind,
            Some(HttpErrorKind::Timeout | HttpErrorKind::Interrupted)
        ) {
            (
                K::TimedOut,
                format!(
                    "{what}: the object store at {} did not answer in time ({}s a request, retried for up to {}s): {}",
                    self.endpoint,
                    REQUEST_TIMEOUT.as_secs(),
                    RETRY_TIMEOUT.as_secs(),
                    innermost(&e)
                ),
            )
        } else if matches!(
            e,
            object_store::Error::NotImplemented { .. } | object_store::Error::NotSupported { .. }
        ) {
            (
                K::Unsupported,
                format!("{what}: not supported by this store: {}", clip(&text)),
            )
        } else if status == Some(503) || code == "ServiceUnavailable" || code == "SlowDown" {
            (
                K::Other,
                format!(
                    "{what}: the object store at {} is unavailable ({detail})",
                    self.endpoint
                ),
            )
        } else if status.is_some_and(|s| s >= 500) {
            (
                K::Other,
                format!(
                    "{what}: the object store at {} failed ({detail})",
                    self.endpoint
                ),
            )
        } else if http_kind.is_some() {
            (
                K::Other,
                format!(
                    "{what}: talking to the object store at {} failed: {}",
                    self.endpoint,
                    innermost(&e)
                ),
            )
        } else if status.is_some() {
            (
                K::Other,
                format!(
                    "{what}: the object store at {} answered {detail}",
                    self.endpoint
                ),
            )
        } else {
            (K::Other, format!("{what}: {}", clip(&text)))
        };
        io::Error::new(kind, message)
    }
}

impl Drop for S3Store {
    fn drop(&mut self) {
        // Never blocks, so dropping a store inside another runtime does not panic.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl BlobStore for S3Store {
    fn put(&self, key: &str, bytes: &[u8]) -> io::Result<()> {
        let path = self.path(key)?;
        let client = self.client.clone();
        let payload = PutPayload::from(bytes.to_vec());
        self.run(async move { client.put(&path, payload).await })?
            .map(|_| ())
            .map_err(|e| self.error("put", key, e))
    }

    fn put_if_absent(&self, key: &str, bytes: &[u8]) -> io::Result<bool> {
        let path = self.path(key)?;
        let client = self.client.clone();
        let payload = PutPayload::from(bytes.to_vec());
        let result = self.run(async move {
            client
                .put_opts(&path, payload, PutOptions::from(PutMode::Create))
                .await
        })?;
        match result {
            Ok(_) => Ok(true),
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => Ok(false),
            Err(e) => Err(self.error("put", key, e)),
        }
    }

    fn get(&self, key: &str) -> io::Result<Vec<u8>> {
        let path = self.path(key)?;
        let client = self.client.clone();
        let result = self.run(async move {
            let got = client.get(&path).await?;
            let size = got.meta.size;
            got.bytes().await.map(|b| (size, b))
        })?;
        let (size, bytes) = result.map_err(|e| self.error("get", key, e))?;
        if bytes.len() as u64 != size {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "get {}: the store sent {} of the object's {size} bytes",
                    self.describe_key(key),
                    bytes.len()
                ),
            ));
        }
        Ok(Vec::from(bytes))
    }

    fn get_range(&self, key: &str, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let path = self.path(key)?;
        let client = self.client.clone();
        let short = |size: u64| {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "get {}: the object holds {size} bytes, not {offset}+{len}",
                    self.describe_key(key)
                ),
            )
        };
        if len == 0 {
            // An empty range is no HTTP range: ask for the size.
            let meta = self
                .run(async move { client.head(&path).await })?
                .map_err(|e| self.error("head", key, e))?;
            return if offset <= meta.size {
                Ok(Vec::new())
            } else {
                Err(short(meta.size))
            };
        }
        let end = offset
            .checked_add(len as u64)
            .ok_or_else(|| short(u64::MAX))?;
        let result = self.run(async move {
            let options = GetOptions {
                range: Some(GetRange::Bounded(offset..end)),
                ..Default::default()
            };
            let got = client.get_opts(&path, options).await?;
            let size = got.meta.size;
            got.bytes().await.map(|b| (size, b))
        })?;
        let (size, bytes) = match result {
            Ok(got) => got,
            Err(e) => {
                let e = self.error("get", key, e);
                return Err(if e.kind() == io::ErrorKind::UnexpectedEof {
                    io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!(
                            "get {}: the object is shorter than {offset}+{len} bytes",
                            self.describe_key(key)
                        ),
                    )
                } else {
                    e
                });
            }
        };
        if bytes.len() != len {
            return Err(short(size));
        }
        Ok(Vec::from(bytes))
    }

    fn list(&self, prefix: &str) -> io::Result<Vec<(String, u64)>> {
        // S3 lists by key prefix, object_store by whole path segments: list the segments
        // before the prefix's last '/' and keep the keys that start with the prefix.
        let dir = prefix.rfind('/').map_or("", |i| &prefix[..i]);
        let Ok(dir_path) = self.dir_path(dir) else {
            // No key has an empty segment or a control character (see `path`).
            return Ok(Vec::new());
        };
        let client = self.client.clone();
        let metas = self
            .run(async move { client.list(dir_path.as_ref()).try_collect::<Vec<_>>().await })?
            .map_err(|e| self.error("list", prefix, e))?;
        let strip = if self.url.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.url.prefix)
        };
        let mut listed: Vec<(String, u64)> = metas
            .into_iter()
            .filter_map(|meta| {
                let key = meta.location.as_ref().strip_prefix(strip.as_str())?;
                key.starts_with(prefix)
                    .then(|| (key.to_string(), meta.size))
            })
            .collect();
        listed.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Ok(listed)
    }

    fn delete(&self, key: &str) -> io::Result<()> {
        let path = self.path(key)?;
        let client = self.client.clone();
        match self.run(async move { client.delete(&path).await })? {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => {
                let e = self.error("delete", key, e);
                if e.kind() == io::ErrorKind::NotFound {
                    Ok(())
                } else {
                    Err(e)
                }
            }
        }
    }

    fn describe(&self) -> String {
        self.url.to_string()
    }
}

/// The HTTP status in object_store's message ("... status code: 403 Forbidden ...").
fn status_of(text: &str) -> Option<u16> {
    let at = text.find("status code: ")? + "status code: ".len();
    text[at..].get(..3)?.parse().ok()
}

/// `<Field>value</Field>` from an S3 XML error body in `text`.
fn xml_field(text: &str, field: &str) -> Option<String> {
    let open = format!("<{field}>");
    let close = format!("</{field}>");
    let start = text.find(&open)? + open.len();
    let end = start + text[start..].find(&close)?;
    let value = text[start..end]
        .trim()
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    (!value.is_empty()).then_some(value)
}

fn http_error_kind(e: &(dyn std::error::Error + 'static)) -> Option<HttpErrorKind> {
    let mut at: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = at {
        if let Some(http) = err.downcast_ref::<HttpError>() {
            return Some(http.kind());
        }
        at = err.source();
    }
    None
}

/// The deepest cause in `e`'s chain, on one line ("Connection refused (os error 111)").
fn innermost(e: &(dyn std::error::Error + 'static)) -> String {
    let mut at = e;
    while let Some(next) = at.source() {
        at = next;
    }
    clip(&flatten(&at.to_string()))
}

/// `e` and its causes on one line, each cause only where its parent's message lacks it.
fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = flatten(&e.to_string());
    let mut at = e.source();
    while let Some(err) = at {
        let part = flatten(&err.to_string());
        if !part.is_empty() && !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        at = err.source();
    }
    text
}

/// The settings of the AWS profile (`AWS_PROFILE`, else `default`) as AWS_* variables:
/// keys and session token from the shared credentials file (`AWS_SHARED_CREDENTIALS_FILE`,
/// else `~/.aws/credentials`), region and endpoint from the config file (`AWS_CONFIG_FILE`,
/// else `~/.aws/config`, section `[profile NAME]` or `[default]`), as the AWS CLI reads
/// them. A profile named by `AWS_PROFILE` must exist; the default one need not.
fn profile_vars(vars: &[(String, String)]) -> Result<Vec<(String, String)>, String> {
    let var = |name: &str| {
        vars.iter()
            .rev()
            .find(|(k, v)| k == name && !v.is_empty())
            .map(|(_, v)| v.clone())
    };
    let named = var("AWS_PROFILE");
    let profile = named.clone().unwrap_or_else(|| "default".to_string());
    let home = var("HOME").unwrap_or_default();
    let file =
        |over: &str, default: &str| var(over).unwrap_or_else(|| format!("{home}/.aws/{default}"));
    let (credentials, config) = (
        file("AWS_SHARED_CREDENTIALS_FILE", "credentials"),
        file("AWS_CONFIG_FILE", "config"),
    );
    let read = |path: &str, section: &str| -> Result<Option<Vec<(String, String)>>, String> {
        let ini = match ini::Ini::load_from_file(path) {
            Ok(ini) => ini,
            Err(ini::Error::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read {path}: {}", flatten(&e.to_string()))),
        };
        Ok(ini.section(Some(section)).map(|s| {
            s.iter()
                .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
                .collect()
        }))
    };
    let config_section = match profile.as_str() {
        "default" => "default".to_string(),
        name => format!("profile {name}"),
    };
    let keys = read(&credentials, &profile)?;
    let settings = read(&config, &config_section)?;
    if keys.is_none() && settings.is_none() {
        return match named {
            Some(name) => Err(format!(
                "AWS_PROFILE={name}: no such profile in {credentials} or {config}"
            )),
            None => Ok(Vec::new()),
        };
    }
    let mut out = Vec::new();
    for (name, value) in keys.into_iter().chain(settings).flatten() {
        let var = match name.as_str() {
            "aws_access_key_id" => "AWS_ACCESS_KEY_ID",
            "aws_secret_access_key" => "AWS_SECRET_ACCESS_KEY",
            "aws_session_token" => "AWS_SESSION_TOKEN",
            "region" => "AWS_REGION",
            "endpoint_url" => "AWS_ENDPOINT_URL",
            _ => continue,
        };
        out.push((var.to_string(), value));
    }
    Ok(out)
}

/// Whitespace runs (newlines among them) as single spaces.
fn flatten(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn clip(text: &str) -> String {
    const MAX: usize = 400;
    if text.len() <= MAX {
        return text.to_string();
    }
    let mut end = MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(bucket: &str, prefix: &str) -> S3Url {
        S3Url {
            bucket: bucket.into(),
            prefix: prefix.into(),
        }
    }

    #[test]
    fn addresses_parse_with_their_prefix_normalised() {
        assert_eq!(parse_url("s3://b").unwrap(), url("b", ""));
        assert_eq!(parse_url("s3://b/").unwrap(), url("b", ""));
        assert_eq!(parse_url("s3://b//").unwrap(), url("b", ""));
        assert_eq!(parse_url("s3://b/vol").unwrap(), url("b", "vol"));
        assert_eq!(parse_url("s3://b/vol/").unwrap(), url("b", "vol"));
        assert_eq!(parse_url("s3://b/a/b/c///").unwrap(), url("b", "a/b/c"));
        assert_eq!(
            parse_url("s3://my.bucket-1/x").unwrap(),
            url("my.bucket-1", "x")
        );
        assert_eq!(parse_url("s3://b/a/b/").unwrap().to_string(), "s3://b/a/b");
        assert_eq!(parse_url("s3://b/").unwrap().to_string(), "s3://b");
    }

    #[test]
    fn other_addresses_are_refused_in_one_line() {
        for bad in [
            "http://b/x",
            "S3://b",
            "b/x",
            "",
            "s3://",
            "s3:///x",
            "s3://b/a//c",
            "s3://b c/x",
            "s3://b/a/./c",
            "s3://b/a/\n/c",
        ] {
            let err = parse_url(bad).unwrap_err();
            assert!(!err.contains('\n'), "{bad:?}: {err}");
            assert!(!err.is_empty());
        }
        assert!(parse_url("s3:///x").unwrap_err().contains("no bucket"));
        assert!(parse_url("http://b/x")
            .unwrap_err()
            .contains("s3://BUCKET/PREFIX"));
    }

    fn vars(extra: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut v = vec![
            ("AWS_ACCESS_KEY_ID".to_string(), "GK0".to_string()),
            ("AWS_SECRET_ACCESS_KEY".to_string(), "s".to_string()),
        ];
        v.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        v
    }

    #[test]
    fn the_configuration_comes_from_the_variables_given() {
        let store = S3Store::open_with_vars(
            "s3://bk/vol/",
            vars(&[
                ("AWS_ENDPOINT_URL", "http://127.0.0.1:3910/"),
                ("AWS_ALLOW_HTTP", "true"),
                ("AWS_REGION", "garage"),
            ]),
        )
        .unwrap();
        assert_eq!(store.describe(), "s3://bk/vol");
        assert_eq!(store.endpoint(), "http://127.0.0.1:3910");
        assert_eq!((store.bucket(), store.prefix()), ("bk", "vol"));
        assert_eq!(store.describe_key("a/b"), "s3://bk/vol/a/b");
        assert_eq!(store.path("a/b").unwrap().as_ref(), "vol/a/b");
        for bad in ["", "/a", "a/", "a//b", "a/../b"] {
            let e = store.path(bad).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
        }

        let aws = S3Store::open_with_vars("s3://bk", vars(&[("AWS_DEFAULT_REGION", "eu-west-3")]))
            .unwrap();
        assert_eq!(aws.endpoint(), "https://s3.eu-west-3.amazonaws.com");
        assert_eq!(aws.describe(), "s3://bk");
        assert_eq!(aws.path("k").unwrap().as_ref(), "k");
    }

    #[test]
    fn a_profile_gives_keys_region_and_endpoint_and_variables_win() {
        let home = std::env::temp_dir().join(format!("anvil-s3-profile-{}", std::process::id()));
        std::fs::create_dir_all(home.join(".aws")).unwrap();
        std::fs::write(
            home.join(".aws/credentials"),
            "[default]\naws_access_key_id = DEF\naws_secret_access_key = defsecret\n\n\
             [garage]\naws_access_key_id = GK1\naws_secret_access_key = secret1\n",
        )
        .unwrap();
        std::fs::write(
            home.join(".aws/config"),
            "[profile garage]\nregion = garage\nendpoint_url = http://127.0.0.1:3910\n",
        )
        .unwrap();
        let home_var = ("HOME".to_string(), home.display().to_string());
        let with = |extra: &[(&str, &str)]| {
            let mut vars = vec![home_var.clone()];
            vars.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
            profile_vars(&vars).unwrap()
        };
        let garage = with(&[("AWS_PROFILE", "garage")]);
        let get = |vars: &[(String, String)], name: &str| {
            vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        };
        assert_eq!(get(&garage, "AWS_ACCESS_KEY_ID").as_deref(), Some("GK1"));
        assert_eq!(get(&garage, "AWS_REGION").as_deref(), Some("garage"));
        assert_eq!(
            get(&garage, "AWS_ENDPOINT_URL").as_deref(),
            Some("http://127.0.0.1:3910")
        );
        assert_eq!(get(&with(&[]), "AWS_ACCESS_KEY_ID").as_deref(), Some("DEF"));
        // A store opened with the profile and a variable: the variable wins.
        let store = S3Store::open_with_vars(
            "s3://b/p",
            [
                ("HOME", home.to_str().unwrap()),
                ("AWS_PROFILE", "garage"),
                ("AWS_ALLOW_HTTP", "true"),
                ("AWS_ENDPOINT_URL", "http://127.0.0.1:9999"),
            ],
        )
        .unwrap();
        assert_eq!(store.endpoint(), "http://127.0.0.1:9999");
        let missing = profile_vars(&[home_var.clone(), ("AWS_PROFILE".into(), "nope".into())]);
        assert!(missing.unwrap_err().contains("no such profile"));
        std::fs::remove_dir_all(&home).unwrap();
    }

    #[test]
    fn missing_credentials_and_plain_http_are_refused_before_any_request() {
        let none: Vec<(String, String)> = Vec::new();
        let e = S3Store::open_with_vars("s3://bk/v", none).unwrap_err();
        assert!(e.contains("AWS_ACCESS_KEY_ID"), "{e}");
        let e = S3Store::open_with_vars("s3://bk/v", [("AWS_PROFILE", "dev")]).unwrap_err();
        assert!(e.contains("AWS_PROFILE=dev: no such profile"), "{e}");
        let e = S3Store::open_with_vars("s3://bk/v", [("AWS_ACCESS_KEY_ID", "x")]).unwrap_err();
        assert!(e.contains("AWS_SECRET_ACCESS_KEY"), "{e}");
        let e = S3Store::open_with_vars(
            "s3://bk/v",
            vars(&[("AWS_ENDPOINT_URL", "http://127.0.0.1:1")]),
        )
        .unwrap_err();
        assert!(e.contains("AWS_ALLOW_HTTP"), "{e}");
    }

    #[test]
    fn an_unreachable_store_is_one_line_naming_the_endpoint() {
        // Port 1 on the loopback: nothing listens, the connection is refused at once.
        let store = S3Store::open_with_vars(
            "s3://bk/v",
            vars(&[
                ("AWS_ENDPOINT_URL", "http://127.0.0.1:1"),
                ("AWS_ALLOW_HTTP", "true"),
            ]),
        )
        .unwrap();
        let e = store.check_access().unwrap_err();
        let text = e.to_string();
        assert!(!text.contains('\n'), "{text}");
        assert!(
            text.contains("cannot reach the object store at http://127.0.0.1:1"),
            "{text}"
        );
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{text}");
    }

    /// An https endpoint goes through rustls with ring's provider, which `open` installs: a
    /// server that does not speak TLS fails the handshake, reported in one line.
    #[test]
    fn an_https_store_is_reached_over_tls() {
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!(
            "https://127.0.0.1:{}",
            listener.local_addr().unwrap().port()
        );
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                // A plain HTTP answer to the client's hello.
                let _ = (&stream).write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
            }
        });
        let store =
            S3Store::open_with_vars("s3://bk/v", vars(&[("AWS_ENDPOINT_URL", &endpoint)])).unwrap();
        let text = store.check_access().unwrap_err().to_string();
        assert!(!text.contains('\n'), "{text}");
        assert!(text.contains(&endpoint), "{text}");
    }

    #[test]
    fn error_bodies_give_their_code_and_status() {
        let text = "Error performing GET http://x in 1ms - Server returned non-2xx status code: 404 Not Found: <?xml version=\"1.0\"?> <Error><Code>NoSuchBucket</Code><Message>Bucket not found</Message></Error>";
        assert_eq!(status_of(text), Some(404));
        assert_eq!(xml_field(text, "Code").as_deref(), Some("NoSuchBucket"));
        assert_eq!(
            xml_field(text, "Message").as_deref(),
            Some("Bucket not found")
        );
        assert_eq!(xml_field(text, "Resource"), None);
        assert_eq!(
            xml_field(
                "<Message>[&quot;a&quot; &amp; &lt;b&gt;]</Message>",
                "Message"
            )
            .as_deref(),
            Some("[\"a\" & <b>]")
        );
        assert_eq!(flatten("a\n  b\tc "), "a b c");
        assert_eq!(clip(&"é".repeat(300)).len(), 403);
    }

    #[test]
    fn a_store_can_be_used_and_dropped_inside_another_runtime() {
        let store = S3Store::open_with_vars(
            "s3://bk/v",
            vars(&[
                ("AWS_ENDPOINT_URL", "http://127.0.0.1:1"),
                ("AWS_ALLOW_HTTP", "true"),
            ]),
        )
        .unwrap();
        let outer = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        outer.block_on(async move {
            assert!(store.get("k").is_err());
            drop(store);
        });
    }
}

#[cfg(test)]
mod slow_tests {
    use super::*;

    /// Takes REQUEST_TIMEOUT (30 s): `cargo test -p anvil-s3 -- --ignored`.
    #[test]
    #[ignore]
    fn a_store_that_never_answers_times_out_in_one_line() {
        // Accepts connections and reads nothing, answers nothing.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let _held = std::thread::spawn(move || {
            let mut held = Vec::new();
            for conn in listener.incoming() {
                held.push(conn);
            }
        });
        let store = S3Store::open_with_vars(
            "s3://bk/v",
            [
                ("AWS_ACCESS_KEY_ID", "k"),
                ("AWS_SECRET_ACCESS_KEY", "s"),
                ("AWS_ENDPOINT_URL", &format!("http://127.0.0.1:{port}")),
                ("AWS_ALLOW_HTTP", "true"),
            ],
        )
        .unwrap();
        let started = std::time::Instant::now();
        let e = store.get("k").unwrap_err();
        let took = started.elapsed();
        let text = e.to_string();
        eprintln!("after {took:?}: {text}");
        assert!(!text.contains('\n'), "{text}");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{text}");
        assert!(text.contains("did not answer in time"), "{text}");
        assert!(took < REQUEST_TIMEOUT + RETRY_TIMEOUT + Duration::from_secs(5));
    }
}
