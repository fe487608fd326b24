//! The fleet tier's command line, and what it reads from files at start.

use std::path::PathBuf;
use std::time::Duration;

use rpcedge_core::cache::sealed::Sealer;

/// The fleet tier: a Redis Cluster behind the local store, shared by every host of a fleet.
#[derive(Debug, clap::Args)]
pub struct FleetArgs {
    /// Seed nodes of the Redis Cluster, comma-separated: redis://HOST:PORT, or rediss://HOST:PORT
    /// for TLS (no credentials in the URL: --fleet-user and --fleet-password-file).
    #[arg(long = "fleet", value_delimiter = ',')]
    pub seeds: Vec<String>,
    /// The fleet's secret (at least 32 bytes; a trailing newline is not part of it): every value
    /// carries a MAC under it, and one that fails it is never served. Required with --fleet.
    #[arg(long)]
    pub fleet_secret_file: Option<PathBuf>,
    /// The ACL user the daemon connects as (Redis's `default` without it).
    #[arg(long)]
    pub fleet_user: Option<String>,
    /// A file whose first line is the ACL user's password.
    #[arg(long)]
    pub fleet_password_file: Option<PathBuf>,
    /// PEM certificates to trust for rediss:// (the system's roots without it).
    #[arg(long)]
    pub fleet_ca_file: Option<PathBuf>,
    /// How long a lookup waits for the fleet before it counts as a miss.
    #[arg(long, default_value = "20ms", value_parser = crate::units::parse_duration)]
    pub fleet_timeout: Duration,
    /// Every fleet value expires within this (an entry with a shorter TTL, within that).
    #[arg(long, default_value = "6h", value_parser = crate::units::parse_duration)]
    pub fleet_ttl: Duration,
    /// How far apart the clocks of the fleet's hosts may be. A value's expiry is sealed on its
    /// writer's clock: a reader keeps the value for what Redis says is left of it (its own clock
    /// needs no agreement), and never past the sealed expiry by more than this, so a Redis that
    /// lies about a time to live gains at most this.
    #[arg(long, default_value = "5m", value_parser = crate::units::parse_duration_or_zero)]
    pub fleet_clock_skew: Duration,
    /// Entries larger than this stay local.
    #[arg(long, default_value = "1MiB", value_parser = crate::units::parse_size)]
    pub fleet_max_entry: u64,
    /// Bound on the bytes of entries waiting to be written to the fleet; more are dropped.
    #[arg(long, default_value = "64MiB", value_parser = crate::units::parse_size)]
    pub fleet_queue: u64,
}

/// The fleet's settings, files read.
pub struct FleetSettings {
    pub seeds: Vec<String>,
    pub tls: bool,
    pub sealer: Sealer,
    pub user: Option<String>,
    pub password: Option<String>,
    pub ca: Option<Vec<u8>>,
    pub timeout: Duration,
    pub ttl: Duration,
    pub clock_skew: Duration,
    pub max_entry: usize,
    pub queue_bytes: usize,
}

impl FleetArgs {
    /// The settings, or `None` without `--fleet`; a clear error for anything wrong.
    pub fn settings(&self) -> Result<Option<FleetSettings>, String> {
        if self.seeds.is_empty() {
            let stray = self.fleet_secret_file.is_some() || self.fleet_user.is_some() || self.fleet_password_file.is_some();
            return match stray {
                true => Err("--fleet-secret-file, --fleet-user and --fleet-password-file need --fleet".into()),
                false => Ok(None),
            };
        }
        let mut tls = None;
        for seed in &self.seeds {
            let (scheme, rest) = seed.split_once("://").ok_or(format!("--fleet {seed:?}: expected redis://HOST:PORT"))?;
            let secure = match scheme {
                "redis" => false,
                "rediss" => true,
                _ => return Err(format!("--fleet {seed:?}: redis:// or rediss://")),
            };
            if rest.contains('@') {
                return Err(format!("--fleet {seed:?}: no credentials in the URL (--fleet-user, --fleet-password-file)"));
            }
            if rest.trim_end_matches('/').rsplit_once(':').is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err()) {
                return Err(format!("--fleet {seed:?}: expected HOST:PORT after the scheme"));
            }
            if tls.replace(secure).is_some_and(|before| before != secure) {
                return Err("--fleet: every seed redis://, or every seed rediss://".into());
            }
        }
        let secret_file = self.fleet_secret_file.as_ref().ok_or("--fleet needs --fleet-secret-file")?;
        let secret = std::fs::read(secret_file).map_err(|e| format!("--fleet-secret-file {}: {e}", secret_file.display()))?;
        let secret = secret.strip_suffix(b"\n").unwrap_or(&secret);
        let sealer = Sealer::new(secret.strip_suffix(b"\r").unwrap_or(secret))?;
        let password = match &self.fleet_password_file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| format!("--fleet-password-file {}: {e}", path.display()))?;
                Some(text.lines().next().unwrap_or("").to_string())
            }
            None => None,
        };
        let ca = match &self.fleet_ca_file {
            Some(path) => Some(std::fs::read(path).map_err(|e| format!("--fleet-ca-file {}: {e}", path.display()))?),
            None => None,
        };
        let bytes = |value: u64, flag: &str| usize::try_from(value).map_err(|_| format!("{flag}: too large"));
        Ok(Some(FleetSettings {
            seeds: self.seeds.clone(),
            tls: tls == Some(true),
            sealer,
            user: self.fleet_user.clone(),
            password,
            ca,
            timeout: self.fleet_timeout,
            ttl: self.fleet_ttl,
            clock_skew: self.fleet_clock_skew,
            max_entry: bytes(self.fleet_max_entry, "--fleet-max-entry")?,
            queue_bytes: bytes(self.fleet_queue, "--fleet-queue")?,
        }))
    }
}
