//! From global options to a store, keys and a lock manager.

use std::time::Duration;

use leasehold::{BoxStore, LockKey, LockLevel, LockManager, MemoryStore};
use leasehold_aerospike::{AerospikeConfig, AerospikeStore};
use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_redis::{RedisConfig, RedisStore};

use crate::cli::{Global, Level};
use crate::exit::CliError;
use crate::store_url::StoreUrl;

/// Farm id when neither `--farm-id` nor the URL's `farm=` gives one.
const DEFAULT_FARM: &str = "local";

/// What the global options say, checked, before anything is sent: the store's URL and how
/// keys are named. A command checks its own arguments against it, then connects.
pub(crate) struct Names {
    url: StoreUrl,
    pub(crate) client_id: String,
    pub(crate) farm_id: String,
    /// Whether `--farm-id` named the farm (not the URL's `farm=` or the default).
    farm_given: bool,
    pub(crate) level: LockLevel,
}

impl Names {
    /// Parses the global options (bad input: exit 2, before any I/O).
    pub(crate) fn parse(global: &Global) -> Result<Self, CliError> {
        let url = StoreUrl::parse(&global.store).map_err(|e| CliError::usage(e.to_string()))?;
        let farm_id = global
            .farm_id
            .clone()
            .or_else(|| url.farm().map(str::to_owned))
            .unwrap_or_else(|| DEFAULT_FARM.to_owned());
        let level = match global.level {
            Level::Dc => LockLevel::Dc,
            Level::Xdc => LockLevel::Xdc,
        };
        LockKey::dc(&farm_id, &global.client_id, "probe").map_err(|e| {
            CliError::usage(format!(
                "{} (e.g. --client-id billing --farm-id eu1)",
                e.chain()
            ))
        })?;
        Ok(Names {
            url,
            client_id: global.client_id.clone(),
            farm_id,
            farm_given: global.farm_id.is_some(),
            level,
        })
    }

    /// These names, for a full key or prefix given on the command line (`inspect`, `list`,
    /// `release`, `history`): one that names a DC farm (`DC#<farm>#…`, or a prefix `DC#<farm>`)
    /// is read with that farm's store.
    /// Aerospike keeps each farm's DC locks in a set of its own and reads its farm's only, so
    /// without this `list DC#farm2#` against a `farm1` URL found nothing. `--farm-id` naming
    /// another farm than the key is a usage error.
    pub(crate) fn farm_of(mut self, raw: &str) -> Result<Self, CliError> {
        let Some(farm) = raw
            .strip_prefix("DC#")
            .map(|rest| rest.split_once('#').map_or(rest, |(farm, _)| farm))
            .filter(|farm| !farm.is_empty())
        else {
            return Ok(self);
        };
        if farm == self.farm_id {
            return Ok(self);
        }
        if self.farm_given {
            return Err(CliError::usage(format!(
                "{raw:?} names farm `{farm}`, but --farm-id is `{}`: drop --farm-id, or name a \
                 key of that farm",
                self.farm_id
            )));
        }
        LockKey::dc(farm, &self.client_id, "probe")
            .map_err(|e| CliError::usage(format!("{raw:?}: {}", e.chain())))?;
        self.farm_id = farm.to_owned();
        Ok(self)
    }

    /// A key given on the command line: a full storage key (contains `#`) or an entity name.
    pub(crate) fn key(&self, raw: &str) -> Result<LockKey, CliError> {
        let key = if raw.contains('#') {
            raw.parse::<LockKey>()
        } else {
            self.entity_key(raw)
        };
        key.map_err(|e| {
            CliError::usage(format!(
                "{} (e.g. `nightly-report` or `DC#farm1#cli#nightly-report`)",
                e.chain()
            ))
        })
    }

    /// The lock key of election `name` (as `LockManager::election_key` names it).
    pub(crate) fn election(&self, name: &str) -> Result<LockKey, CliError> {
        self.entity_key(&leasehold::election::entity(name))
            .map_err(|e| CliError::usage(format!("{} (e.g. `invoicer`)", e.chain())))
    }

    /// The key of `entity` at the chosen level, farm and client.
    fn entity_key(&self, entity: &str) -> leasehold::Result<LockKey> {
        LockKey::new(self.level, Some(&self.farm_id), &self.client_id, entity)
    }

    /// A manager over `store` naming keys as these options say, resolving lock calls against
    /// `scenarios`. Over the embedded store, it checks a call before connecting.
    pub(crate) fn manager_over(
        &self,
        store: BoxStore,
        scenarios: leasehold::scenario::ScenarioRegistry,
    ) -> leasehold::Result<LockManager> {
        LockManager::builder()
            .scenarios(scenarios)
            .client_id(&self.client_id)
            .farm_id(&self.farm_id)
            .default_level(self.level)
            .store(store)
            .default_layers()
            .build()
    }

    /// Connects (exit 69 naming the address when the store cannot be reached).
    pub(crate) async fn connect(self) -> Result<Target, CliError> {
        let store = connect(&self.url, &self.farm_id).await?;
        Ok(Target { names: self, store })
    }
}

/// Checks a lease's TTL and holder label as given on the command line (exit 2).
pub(crate) fn check_lease(ttl: Option<Duration>, label: Option<&str>) -> Result<(), CliError> {
    if let Some(ttl) = ttl {
        leasehold::core::validate_ttl(ttl).map_err(|e| CliError::usage(e.chain().to_string()))?;
    }
    if let Some(label) = label {
        leasehold::core::TokenLabel::new(label)
            .map_err(|e| CliError::usage(e.chain().to_string()))?;
    }
    Ok(())
}

/// The store a command talks to, with what it needs to name keys and report errors.
pub(crate) struct Target {
    pub(crate) names: Names,
    pub(crate) store: BoxStore,
}

impl Target {
    /// Parses the options (bad input: exit 2 before any I/O) and connects (exit 69 naming the
    /// address when the store cannot be reached).
    pub(crate) async fn connect(global: &Global) -> Result<Self, CliError> {
        Names::parse(global)?.connect().await
    }

    /// The store's URL, as given.
    pub(crate) fn url(&self) -> &StoreUrl {
        &self.names.url
    }

    /// A manager over this store, with the default layer stack.
    pub(crate) fn manager(&self) -> Result<LockManager, CliError> {
        self.manager_with(leasehold::scenario::ScenarioRegistry::new())
    }

    /// A manager resolving lock calls against `scenarios`.
    pub(crate) fn manager_with(
        &self,
        scenarios: leasehold::scenario::ScenarioRegistry,
    ) -> Result<LockManager, CliError> {
        self.names
            .manager_over(self.store.clone(), scenarios)
            .map_err(|e| self.error(e))
    }

    /// Maps a library error, naming this store's address.
    pub(crate) fn error(&self, error: leasehold::Error) -> CliError {
        CliError::from_lock(error, &self.names.url.address())
    }
}

async fn connect(url: &StoreUrl, farm_id: &str) -> Result<BoxStore, CliError> {
    let address = url.address();
    let fail = |e: leasehold::Error| CliError::from_lock(e, &address);
    match url {
        StoreUrl::Memory => Ok(BoxStore::new(MemoryStore::new())),
        StoreUrl::Redis { url, tls } => {
            let mut config = RedisConfig::new(url.as_str());
            if let Some(ca) = &tls.ca {
                config = config.tls_ca_file(ca);
            }
            if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
                config = config.tls_client_cert(cert, key);
            }
            let store = RedisStore::connect(config).await.map_err(fail)?;
            Ok(BoxStore::new(store))
        }
        StoreUrl::RedisGroup { raw, .. } => {
            let store = RedisStore::connect(RedisConfig::new(raw.as_str()))
                .await
                .map_err(fail)?;
            Ok(BoxStore::new(store))
        }
        StoreUrl::Aerospike {
            seeds,
            namespace,
            set_suffix,
            user,
            password,
            tls_name,
            tls,
            ..
        } => {
            let mut config = AerospikeConfig::new(
                seeds.as_str(),
                namespace.as_str(),
                // --farm-id, else the URL's farm=, else the default: the same farm as the keys.
                farm_id,
            );
            if let Some(suffix) = set_suffix {
                config = config.set_suffix(suffix.as_str());
            }
            if let (Some(user), Some(password)) = (user, password) {
                config = config.credentials(user.as_str(), password.as_str());
            }
            if let Some(name) = tls_name {
                config = config.tls_name(name.as_str());
            }
            if let Some(ca) = &tls.ca {
                config = config.tls_ca_file(ca);
            }
            if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
                config = config.tls_client_cert(cert, key);
            }
            let store = AerospikeStore::connect(config).await.map_err(fail)?;
            Ok(BoxStore::new(store))
        }
        StoreUrl::Etcd { raw, .. } => {
            let config = EtcdConfig::from_url(raw).map_err(fail)?;
            let store = EtcdStore::connect(config).await.map_err(fail)?;
            Ok(BoxStore::new(store))
        }
    }
}
