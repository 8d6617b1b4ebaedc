//! Domain states and entity ids for the `state_machine` strategy.

/// A domain entity's lifecycle state, stored as text in its state column.
///
/// Derive it: the names checked by the compiler are the enum's variants, so
/// a misspelt `from` or `to` state does not compile. Variant names are
/// stored in SCREAMING_SNAKE_CASE unless renamed.
///
/// ```
/// #[derive(Debug, Clone, Copy, PartialEq, Eq, idem_runtime::State)]
/// enum CouponState {
///     Unused,
///     #[state(rename = "DEDUCTED")]
///     Used,
///     PartlyRefunded,
/// }
///
/// use idem_runtime::State;
/// assert_eq!(CouponState::Unused.as_str(), "UNUSED");
/// assert_eq!(CouponState::Used.as_str(), "DEDUCTED");
/// assert_eq!(CouponState::PartlyRefunded.as_str(), "PARTLY_REFUNDED");
/// assert_eq!(CouponState::parse("DEDUCTED"), Some(CouponState::Used));
/// ```
pub trait State: Sized + 'static {
    /// The text stored in the state column.
    fn as_str(&self) -> &'static str;
    /// The state stored as `text`, if any.
    fn parse(text: &str) -> Option<Self>;
}

/// An entity id value bound into the state machine's queries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntityIdValue {
    /// An integer id.
    Int(i64),
    /// A text id.
    Text(String),
}

impl std::fmt::Display for EntityIdValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EntityIdValue::Int(i) => write!(f, "{i}"),
            EntityIdValue::Text(s) => write!(f, "{s:?}"),
        }
    }
}

/// A type usable as the `id = ...` of a state machine entity.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as an entity id",
    note = "entity ids are integers (up to i64), strings, or newtypes implementing `idem_runtime::EntityId`"
)]
pub trait EntityId {
    /// The value bound into `WHERE id = ?`.
    fn entity_id(&self) -> EntityIdValue;
}

macro_rules! int_id {
    ($($t:ty),*) => {$(
        impl EntityId for $t {
            fn entity_id(&self) -> EntityIdValue {
                EntityIdValue::Int(i64::from(*self))
            }
        }
    )*};
}
int_id!(i8, i16, i32, i64, u8, u16, u32);

impl EntityId for str {
    fn entity_id(&self) -> EntityIdValue {
        EntityIdValue::Text(self.to_owned())
    }
}

impl EntityId for String {
    fn entity_id(&self) -> EntityIdValue {
        EntityIdValue::Text(self.clone())
    }
}

impl<T: EntityId + ?Sized> EntityId for &T {
    fn entity_id(&self) -> EntityIdValue {
        (**self).entity_id()
    }
}

#[cfg(feature = "uuid")]
impl EntityId for uuid::Uuid {
    fn entity_id(&self) -> EntityIdValue {
        EntityIdValue::Text(self.hyphenated().to_string())
    }
}
