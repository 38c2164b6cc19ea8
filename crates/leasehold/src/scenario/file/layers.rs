//! The `[scenario.layers]` table: each layer `true`/`false`, or a table of its settings (the
//! layer on, with its defaults for the settings the table leaves out).

use std::fmt;
use std::marker::PhantomData;
use std::ops::Range;

use serde::de::value::MapAccessDeserializer;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use toml::Spanned;

use super::Place;
use crate::layers::{
    GracefulShutdownLayer, LocalCompetitionLayer, ReadbackLayer, ReentrancyLayer, UnlockWindowLayer,
};
use crate::scenario::error::ScenarioError;
use crate::scenario::layers::{LayerSetting, LayerSettings};

/// Generates the `[scenario.layers]` table from the list of layers
/// ([`scenario_layers!`](crate::layers::scenario_layers)): one optional entry per layer, read
/// as that layer's [`InFile::Table`].
macro_rules! raw_layers {
    ($($name:ident: $layer:ty),* $(,)?) => {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        pub(super) struct RawLayers {
            $($name: Option<RawLayer<<$layer as InFile>::Table>>,)*
        }

        impl RawLayers {
            /// The layer settings; `spans` gets where each setting the registry checks was
            /// written.
            pub(super) fn settings(
                &self,
                place: &Place<'_>,
                spans: &mut Spans,
            ) -> Result<LayerSettings, ScenarioError> {
                Ok(LayerSettings {
                    $($name: setting(&self.$name, place, spans)?,)*
                })
            }
        }
    };
}

crate::layers::scenario_layers!(raw_layers);

/// Where each layer setting was written: (the field as the registry's checks name it, its span).
type Spans = Vec<(&'static str, Range<usize>)>;

/// How a layer is written in the file: the table of its settings.
trait InFile {
    type Table: RawTable<Layer = Self>;
}

/// One layer in the file.
enum RawLayer<T> {
    Toggle(bool),
    Table(T),
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for RawLayer<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Either<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for Either<T> {
            type Value = RawLayer<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`true`, `false` or a table of the layer's settings")
            }
            fn visit_bool<E>(self, on: bool) -> Result<Self::Value, E> {
                Ok(RawLayer::Toggle(on))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map)).map(RawLayer::Table)
            }
        }
        deserializer.deserialize_any(Either(PhantomData))
    }
}

/// A layer's table: builds the layer's configuration, rejecting what its setters would silently
/// clamp (a zero the layer raises to its minimum) or ignore.
trait RawTable {
    type Layer;
    fn build(&self, place: &Place<'_>, spans: &mut Spans) -> Result<Self::Layer, ScenarioError>;
}

fn setting<T: RawTable>(
    raw: &Option<RawLayer<T>>,
    place: &Place<'_>,
    spans: &mut Spans,
) -> Result<Option<LayerSetting<T::Layer>>, ScenarioError> {
    raw.as_ref()
        .map(|raw| match raw {
            RawLayer::Toggle(on) => Ok(LayerSetting::from(*on)),
            RawLayer::Table(table) => table.build(place, spans).map(LayerSetting::With),
        })
        .transpose()
}

/// `Err` naming `field` when `value` is zero.
fn not_zero<T: PartialEq + Default>(
    place: &Place<'_>,
    field: &str,
    value: Option<&Spanned<T>>,
    what: &str,
) -> Result<(), ScenarioError> {
    match value {
        Some(v) if *v.get_ref() == T::default() => {
            Err(place.invalid(field, v.span(), format!("must be at least 1 ({what})")))
        }
        _ => Ok(()),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReadback {
    retries: Option<Spanned<u32>>,
}

impl InFile for ReadbackLayer {
    type Table = RawReadback;
}

impl RawTable for RawReadback {
    type Layer = ReadbackLayer;
    fn build(&self, _: &Place<'_>, spans: &mut Spans) -> Result<ReadbackLayer, ScenarioError> {
        const RETRIES: &str = "layers.readback.retries";
        let layer = ReadbackLayer::new();
        spans.extend(self.retries.as_ref().map(|r| (RETRIES, r.span())));
        Ok(match &self.retries {
            Some(retries) => layer.retries(*retries.get_ref()),
            None => layer,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUnlockWindow {
    margin: Option<Spanned<String>>,
}

impl InFile for UnlockWindowLayer {
    type Table = RawUnlockWindow;
}

impl RawTable for RawUnlockWindow {
    type Layer = UnlockWindowLayer;
    fn build(&self, place: &Place<'_>, spans: &mut Spans) -> Result<Self::Layer, ScenarioError> {
        const MARGIN: &str = "layers.unlock_window.margin";
        let mut layer = UnlockWindowLayer::new();
        if let Some(margin) = place.duration(MARGIN, self.margin.as_ref())? {
            layer = layer.margin(margin);
        }
        spans.extend(self.margin.as_ref().map(|m| (MARGIN, m.span())));
        Ok(layer)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLocalCompetition {
    hand_off: Option<bool>,
    max_hand_offs: Option<Spanned<u32>>,
    max_hand_off_hold: Option<Spanned<String>>,
    capacity: Option<Spanned<u64>>,
}

impl InFile for LocalCompetitionLayer {
    type Table = RawLocalCompetition;
}

impl RawTable for RawLocalCompetition {
    type Layer = LocalCompetitionLayer;
    fn build(&self, place: &Place<'_>, spans: &mut Spans) -> Result<Self::Layer, ScenarioError> {
        const MAX: &str = "layers.local_competition.max_hand_offs";
        const HOLD: &str = "layers.local_competition.max_hand_off_hold";
        const CAPACITY: &str = "layers.local_competition.capacity";
        let hand_off = self.hand_off.unwrap_or(false);
        let bounds = [
            (MAX, self.max_hand_offs.as_ref().map(Spanned::span)),
            (HOLD, self.max_hand_off_hold.as_ref().map(Spanned::span)),
        ];
        for (field, span) in bounds {
            match span {
                Some(span) if !hand_off => {
                    return Err(place.invalid(
                        field,
                        span,
                        "bounds hand-offs, which are off: add `hand_off = true` or remove it"
                            .to_owned(),
                    ))
                }
                Some(span) => spans.push((field, span)),
                None => {}
            }
        }
        not_zero(
            place,
            CAPACITY,
            self.capacity.as_ref(),
            "how many keys may have a local entry at once",
        )?;
        let mut layer = LocalCompetitionLayer::new().hand_off(hand_off);
        if let Some(max) = &self.max_hand_offs {
            layer = layer.max_hand_offs(*max.get_ref());
        }
        if let Some(hold) = place.duration(HOLD, self.max_hand_off_hold.as_ref())? {
            layer = layer.max_hand_off_hold(hold);
        }
        if let Some(capacity) = &self.capacity {
            layer = layer.capacity(*capacity.get_ref());
        }
        Ok(layer)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReentrancy {
    max_depth: Option<Spanned<u32>>,
}

impl InFile for ReentrancyLayer {
    type Table = RawReentrancy;
}

impl RawTable for RawReentrancy {
    type Layer = ReentrancyLayer;
    fn build(&self, place: &Place<'_>, _: &mut Spans) -> Result<Self::Layer, ScenarioError> {
        let depth = self.max_depth.as_ref();
        not_zero(
            place,
            "layers.reentrancy.max_depth",
            depth,
            "the deepest hold count",
        )?;
        let layer = ReentrancyLayer::new();
        Ok(match depth {
            Some(depth) => layer.max_depth(*depth.get_ref()),
            None => layer,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGracefulShutdown {
    deadline: Option<Spanned<String>>,
    purge_interval: Option<Spanned<String>>,
    /// Read only to say where it belongs (the manager), rather than "unknown field".
    exit_code: Option<Spanned<i64>>,
}

impl InFile for GracefulShutdownLayer {
    type Table = RawGracefulShutdown;
}

impl RawTable for RawGracefulShutdown {
    type Layer = GracefulShutdownLayer;
    fn build(&self, place: &Place<'_>, spans: &mut Spans) -> Result<Self::Layer, ScenarioError> {
        const DEADLINE: &str = "layers.graceful_shutdown.deadline";
        const PURGE: &str = "layers.graceful_shutdown.purge_interval";
        if let Some(code) = &self.exit_code {
            return Err(place.invalid(
                "layers.graceful_shutdown.exit_code",
                code.span(),
                "the exit status after a signal belongs to the process, not to a scenario: set \
                 it on the manager (LockManagerBuilder::graceful_shutdown)"
                    .to_owned(),
            ));
        }
        let mut layer = GracefulShutdownLayer::new();
        if let Some(deadline) = place.duration(DEADLINE, self.deadline.as_ref())? {
            layer = layer.deadline(deadline);
        }
        if let Some(purge) = place.duration(PURGE, self.purge_interval.as_ref())? {
            // The setter raises zero to 1 ms; a file saying zero is a mistake worth naming.
            if purge.is_zero() {
                let span = self.purge_interval.as_ref().map_or(0..0, Spanned::span);
                return Err(place.invalid(
                    PURGE,
                    span,
                    "must be above zero (the purge needs a pause between sweeps)".to_owned(),
                ));
            }
            layer = layer.purge_interval(purge);
        }
        spans.extend(self.deadline.as_ref().map(|d| (DEADLINE, d.span())));
        spans.extend(self.purge_interval.as_ref().map(|p| (PURGE, p.span())));
        Ok(layer)
    }
}
