//! What a scenario does with each scenario layer: keep the manager's setting, turn it off, turn it
//! on with the manager's configuration, or turn it on with a configuration of its own.

use std::time::Duration;

use crate::core::MAX_TTL;
use crate::layers::graceful_shutdown::GracefulShutdownLayer;
use crate::layers::local_competition::{LocalCompetitionLayer, DEFAULT_CAPACITY};
use crate::layers::readback::{ReadbackLayer, MAX_READBACK_RETRIES};
use crate::layers::reentrancy::ReentrancyLayer;
use crate::layers::unlock_window::UnlockWindowLayer;

/// What a scenario, or the manager's builder, does with one layer: what [`LayerSettings`]' and
/// [`LockManagerBuilder`](crate::LockManagerBuilder)'s layer methods accept, so
/// `.readback(false)`, `.readback(true)` and `.readback(ReadbackLayer::new().retries(2))` all
/// read well.
///
/// A configuration holds only settings: every layer of every stack reports to the manager's
/// observers and shuts down with it (see [`Wiring`](crate::layers::Wiring)).
///
/// ```
/// use leasehold::layers::ReadbackLayer;
/// use leasehold::scenario::LayerSetting;
/// assert_eq!(LayerSetting::<ReadbackLayer>::from(false), LayerSetting::Off);
/// let own = LayerSetting::from(ReadbackLayer::new().retries(2));
/// assert_eq!(own.config().map(|l| l.retries), Some(2));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayerSetting<L> {
    /// Off for this scenario.
    Off,
    /// On, with the configuration the manager's builder has for the layer (its default if the
    /// manager has the layer off); on the builder, the configuration given before (or the
    /// default).
    On,
    /// On, with this configuration instead of the manager's.
    With(L),
}

impl<L> LayerSetting<L> {
    /// Whether the layer runs.
    pub fn is_on(&self) -> bool {
        !matches!(self, LayerSetting::Off)
    }

    /// The scenario's own configuration, if it gives one.
    pub fn config(&self) -> Option<&L> {
        match self {
            LayerSetting::With(layer) => Some(layer),
            LayerSetting::Off | LayerSetting::On => None,
        }
    }

    /// The configuration the scenario's stack gets, given the manager's (`None`: off there).
    pub(crate) fn resolve(&self, manager: Option<&L>) -> Option<L>
    where
        L: Clone + Default,
    {
        match self {
            LayerSetting::Off => None,
            LayerSetting::On => Some(manager.cloned().unwrap_or_default()),
            LayerSetting::With(layer) => Some(layer.clone()),
        }
    }
}

impl<L> From<bool> for LayerSetting<L> {
    fn from(on: bool) -> Self {
        if on {
            LayerSetting::On
        } else {
            LayerSetting::Off
        }
    }
}

/// A layer configuration a scenario can carry, described and checked.
pub(crate) trait ScenarioLayer {
    /// The layer's name in files and tables.
    const NAME: &'static str;
    /// The settings, readably (`retries(2)`).
    fn summary(&self) -> String;
    /// Checks the settings for a scenario whose TTL is `ttl`: `Err((field, what is wrong))`.
    fn check(&self, ttl: Option<Duration>) -> Result<(), (&'static str, String)>;
}

fn human(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// `Err` when `d` is zero (if `zero_ok` is false) or longer than the longest TTL.
fn in_range(
    field: &'static str,
    d: Duration,
    zero_ok: bool,
    zero_means: &str,
) -> Result<(), (&'static str, String)> {
    if !zero_ok && d.is_zero() {
        return Err((field, format!("must be above zero ({zero_means})")));
    }
    if d > MAX_TTL {
        return Err((field, format!("{} is longer than 30 days", human(d))));
    }
    Ok(())
}

impl ScenarioLayer for ReadbackLayer {
    const NAME: &'static str = "readback";
    fn summary(&self) -> String {
        format!("retries({})", self.retries)
    }
    fn check(&self, _: Option<Duration>) -> Result<(), (&'static str, String)> {
        if self.retries > MAX_READBACK_RETRIES {
            return Err((
                "layers.readback.retries",
                format!(
                    "{} is more than {MAX_READBACK_RETRIES}: each retry is a write sent again \
                     while the store may be failing over; the default is 1",
                    self.retries
                ),
            ));
        }
        Ok(())
    }
}

impl ScenarioLayer for UnlockWindowLayer {
    const NAME: &'static str = "unlock_window";
    fn summary(&self) -> String {
        format!("margin({})", human(self.margin))
    }
    fn check(&self, ttl: Option<Duration>) -> Result<(), (&'static str, String)> {
        const FIELD: &str = "layers.unlock_window.margin";
        in_range(FIELD, self.margin, true, "")?;
        match ttl {
            Some(ttl) if self.margin >= ttl => Err((
                FIELD,
                format!(
                    "a margin of {} is not shorter than the TTL ({}): the window would close \
                     before the lock is taken and every release would be skipped",
                    human(self.margin),
                    human(ttl)
                ),
            )),
            _ => Ok(()),
        }
    }
}

impl ScenarioLayer for LocalCompetitionLayer {
    const NAME: &'static str = "local_competition";
    fn summary(&self) -> String {
        let mut text = match self.hand_off_limits() {
            Some((max, hold)) => format!("hand_off(max {max}, {})", human(hold)),
            None => "no_hand_off".to_owned(),
        };
        if self.key_capacity() != DEFAULT_CAPACITY {
            text.push_str(&format!(" capacity({})", self.key_capacity()));
        }
        text
    }
    fn check(&self, _: Option<Duration>) -> Result<(), (&'static str, String)> {
        if let Some((max, hold)) = self.hand_off_limits() {
            if max == 0 {
                return Err((
                    "layers.local_competition.max_hand_offs",
                    "must be at least 1 (0 would never hand off: turn hand_off off instead)"
                        .to_owned(),
                ));
            }
            in_range(
                "layers.local_competition.max_hand_off_hold",
                hold,
                false,
                "zero would never hand off: turn hand_off off instead",
            )?;
        }
        Ok(())
    }
}

impl ScenarioLayer for ReentrancyLayer {
    const NAME: &'static str = "reentrancy";
    fn summary(&self) -> String {
        format!("max_depth({})", self.max_depth)
    }
    fn check(&self, _: Option<Duration>) -> Result<(), (&'static str, String)> {
        Ok(())
    }
}

impl ScenarioLayer for GracefulShutdownLayer {
    const NAME: &'static str = "graceful_shutdown";
    fn summary(&self) -> String {
        format!(
            "deadline({}) purge({})",
            human(self.deadline),
            human(self.purge_interval)
        )
    }
    fn check(&self, _: Option<Duration>) -> Result<(), (&'static str, String)> {
        in_range(
            "layers.graceful_shutdown.deadline",
            self.deadline,
            false,
            "with no time for the sweep, live locks are left to expire",
        )?;
        in_range(
            "layers.graceful_shutdown.purge_interval",
            self.purge_interval,
            false,
            "the purge needs a pause between sweeps",
        )?;
        if self.exit_code != GracefulShutdownLayer::default().exit_code {
            return Err((
                "layers.graceful_shutdown.exit_code",
                "the exit status after a signal belongs to the process, not to a scenario: set \
                 it on the manager (LockManagerBuilder::graceful_shutdown)"
                    .to_owned(),
            ));
        }
        Ok(())
    }
}

/// Generates, from the list of [`scenario_layers!`], what names every layer: a scenario's
/// [`LayerSettings`] and the stack a builder resolves them to ([`LayerStack`]).
macro_rules! layer_settings {
    ($($name:ident: $layer:ty),* $(,)?) => {
        $(
            impl From<$layer> for LayerSetting<$layer> {
                fn from(layer: $layer) -> Self {
                    LayerSetting::With(layer)
                }
            }
        )*

        /// Which scenario layers a scenario's locks go through, and how each is configured. A layer
        /// left `None` keeps the manager's setting; otherwise see [`LayerSetting`]. A scenario
        /// that sets any layer gets its own layer stack over the same store (with the manager's
        /// observers and lifecycle).
        ///
        /// ```
        /// use std::time::Duration;
        /// use leasehold::layers::LocalCompetitionLayer;
        /// use leasehold::scenario::LayerSettings;
        /// let hot = LayerSettings::new()
        ///     .local_competition(LocalCompetitionLayer::new().hand_off(true).max_hand_offs(4)
        ///         .max_hand_off_hold(Duration::from_millis(200)))
        ///     .unlock_window(false)
        ///     .reentrancy(true);
        /// assert_eq!(hot.describe(),
        ///     "unlock_window=off, local_competition=hand_off(max 4, 200ms), reentrancy=on");
        /// ```
        #[derive(Debug, Clone, Default, PartialEq)]
        #[non_exhaustive]
        pub struct LayerSettings {
            $(
                #[doc = concat!("The [`", stringify!($name), "`](crate::layers::", stringify!($name),
                    ") layer (`None`: the manager's setting).")]
                pub $name: Option<LayerSetting<$layer>>,
            )*
        }

        impl LayerSettings {
            $(
                #[doc = concat!("Sets the `", stringify!($name), "` layer for this scenario: `false` \
                    (off), `true` (on, with the manager's configuration) or a [`",
                    stringify!($layer), "`](crate::layers::", stringify!($layer), ") (on, with this one).")]
                pub fn $name(mut self, setting: impl Into<LayerSetting<$layer>>) -> Self {
                    self.$name = Some(setting.into());
                    self
                }
            )*

            /// The layers the scenario sets, as `name=off|on|settings` (for tables and logs);
            /// `manager` when it sets none.
            pub fn describe(&self) -> String {
                let mut words = Vec::new();
                $(
                    if let Some(setting) = &self.$name {
                        words.push(format!("{}={}", <$layer>::NAME, describe(setting)));
                    }
                )*
                if words.is_empty() {
                    "manager".to_owned()
                } else {
                    words.join(", ")
                }
            }

            /// Checks the configurations the scenario gives, for a scenario whose TTL is `ttl`.
            pub(crate) fn check(&self, ttl: Option<Duration>) -> Result<(), (&'static str, String)> {
                $(
                    if let Some(LayerSetting::With(layer)) = &self.$name {
                        layer.check(ttl)?;
                    }
                )*
                Ok(())
            }
        }

        /// The layers a stack runs, each with its configuration (`None`: off): the builder's, or
        /// a scenario's once its [`LayerSettings`] are applied.
        #[derive(Debug, Clone)]
        pub(crate) struct LayerStack {
            $(pub(crate) $name: Option<$layer>,)*
        }

        impl LayerStack {
            /// The recommended stack: every layer with its default configuration.
            pub(crate) fn all() -> Self {
                LayerStack { $($name: Some(<$layer>::default()),)* }
            }

            /// No scenario layer.
            pub(crate) fn none() -> Self {
                LayerStack { $($name: None,)* }
            }

            /// Turns on, with its default configuration, every layer that is off.
            pub(crate) fn fill_defaults(&mut self) {
                $(self.$name.get_or_insert_with(<$layer>::default);)*
            }

            /// This stack with a scenario's settings: a layer it does not set stays as it is; one
            /// it turns on with `true` keeps this stack's configuration (or gets its default); one
            /// it gives a configuration gets that one.
            pub(crate) fn with_overrides(&self, settings: &LayerSettings) -> Self {
                LayerStack {
                    $($name: match &settings.$name {
                        None => self.$name.clone(),
                        Some(setting) => setting.resolve(self.$name.as_ref()),
                    },)*
                }
            }
        }
    };
}

impl LayerStack {
    /// What the builder checks of a stack (its own, and each scenario's resolved one) at the TTL
    /// its locks get: [`LayerStack::check_ttl`], and the bound on readback retries (which a
    /// layer configured in code has met nowhere else; a scenario's own settings were checked when
    /// it was registered).
    pub(crate) fn check(&self, ttl: Duration) -> Result<(), (&'static str, String)> {
        self.check_ttl(ttl)?;
        match &self.readback {
            Some(readback) => readback.check(Some(ttl)),
            None => Ok(()),
        }
    }

    /// Checks what in this stack depends on its locks' TTL (`ttl`): an unlock window wider than
    /// the lease would skip every release. For a TTL given with a call (the builder checks
    /// everything of its stacks with [`LayerStack::check`]).
    pub(crate) fn check_ttl(&self, ttl: Duration) -> Result<(), (&'static str, String)> {
        match &self.unlock_window {
            Some(window) => window.check(Some(ttl)),
            None => Ok(()),
        }
    }
}

fn describe<L: ScenarioLayer>(setting: &LayerSetting<L>) -> String {
    match setting {
        LayerSetting::Off => "off".to_owned(),
        LayerSetting::On => "on".to_owned(),
        LayerSetting::With(layer) => layer.summary(),
    }
}

crate::layers::scenario_layers!(layer_settings);

impl LayerSettings {
    /// The manager's settings for every layer.
    ///
    /// ```
    /// use leasehold::scenario::LayerSettings;
    /// let raw = LayerSettings::new().local_competition(false).reentrancy(false);
    /// assert_eq!(raw.describe(), "local_competition=off, reentrancy=off");
    /// assert_eq!(LayerSettings::new().describe(), "manager");
    /// ```
    pub fn new() -> Self {
        LayerSettings::default()
    }

    /// Whether the scenario sets any layer (and so gets its own layer stack).
    pub fn overrides_any(&self) -> bool {
        *self != LayerSettings::default()
    }
}
