//! One JSON object as a table of its fields (key, required or not, reader, writer), and the
//! one reader and writer of any object so described: its unknown keys, near misses, required
//! fields and values are checked in one pass, in the table's order.

use serde_json::{Map, Value};

use super::parse::{child, field, object};
use super::unknown::{UnknownKeys, near_miss};
use super::{ConfigError, Rule};

/// Reads a field's value (at a path) into what the object's fields before it made.
pub(super) type Read<T> = fn(&mut T, &Value, &str, &mut Reader) -> Result<(), ConfigError>;

/// Writes a field back as JSON; `None` leaves the key out.
pub(super) type Write<T> = fn(&T) -> Option<Value>;

/// Whether a field must be present (not absent, not `null`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Presence {
    Optional,
    Required,
    /// Optional, and at most one of the object's exclusive fields may be present: a method
    /// config's `retryPolicy` and `hedgingPolicy`, hence [`Rule::BothPolicies`].
    Exclusive,
}

/// A field gRPC defines in an object.
pub(super) struct Field<T> {
    key: &'static str,
    presence: Presence,
    read: Read<T>,
    write: Write<T>,
}

impl<T> Field<T> {
    /// A field that must be present.
    pub(super) const fn required(key: &'static str, read: Read<T>, write: Write<T>) -> Self {
        Field::new(key, Presence::Required, read, write)
    }

    /// A field that may be absent.
    pub(super) const fn optional(key: &'static str, read: Read<T>, write: Write<T>) -> Self {
        Field::new(key, Presence::Optional, read, write)
    }

    /// A field that may be absent, and is refused beside another exclusive one.
    pub(super) const fn exclusive(key: &'static str, read: Read<T>, write: Write<T>) -> Self {
        Field::new(key, Presence::Exclusive, read, write)
    }

    /// A field that may be absent, and is never written (outlier detection's JSON is only
    /// read).
    pub(super) const fn read_only(key: &'static str, read: Read<T>) -> Self {
        Field::new(key, Presence::Optional, read, unwritten)
    }

    /// A field gRPC defines that this crate does not read: never reported as unknown, never
    /// typed, never written.
    pub(super) const fn unread(key: &'static str) -> Self {
        Field::new(key, Presence::Optional, skip, unwritten)
    }

    const fn new(key: &'static str, presence: Presence, read: Read<T>, write: Write<T>) -> Self {
        Field {
            key,
            presence,
            read,
            write,
        }
    }
}

/// What reading a document carries from object to object.
#[derive(Debug)]
pub(super) struct Reader {
    /// The keys no table defines, and what to do with them.
    pub(super) unknown: UnknownKeys,
    /// The names of all method configs read so far (bounded by `MAX_NAMES`).
    pub(super) names_seen: usize,
}

impl Reader {
    pub(super) fn new(unknown: UnknownKeys) -> Reader {
        Reader {
            unknown,
            names_seen: 0,
        }
    }
}

/// The keys of a table, in its order (the order of near-miss ties).
pub(super) fn keys<T>(fields: &'static [Field<T>]) -> impl Iterator<Item = &'static str> + Clone {
    fields.iter().map(|field| field.key)
}

/// The object `value` (at `path`) read by its table, starting from `T::default()`.
pub(super) fn read<T: Default>(
    value: &Value,
    path: &str,
    fields: &'static [Field<T>],
    reader: &mut Reader,
) -> Result<T, ConfigError> {
    let mut read = T::default();
    read_fields(&mut read, value, path, fields, reader)?;
    Ok(read)
}

/// The object `value` (at `path`) read by its table into `read`: its keys checked, then each
/// field read (or found missing) in the table's order.
pub(super) fn read_fields<T>(
    read: &mut T,
    value: &Value,
    path: &str,
    fields: &'static [Field<T>],
    reader: &mut Reader,
) -> Result<(), ConfigError> {
    let object = object(value, path)?;
    reader.unknown.check(object, path, keys(fields))?;
    for entry in fields {
        match field(object, entry.key) {
            Some(_) if entry.presence == Presence::Exclusive && exclusive(object, fields) > 1 => {
                return Err(ConfigError::new(path, Rule::BothPolicies));
            }
            Some(value) => (entry.read)(read, value, &child(path, entry.key), reader)?,
            None if entry.presence == Presence::Required => {
                let near_miss = near_miss(object, keys(fields), entry.key);
                let path = child(path, entry.key);
                return Err(ConfigError::missing(path, entry.key, near_miss));
            }
            None => {}
        }
    }
    Ok(())
}

/// How many exclusive fields of `fields` `object` holds.
fn exclusive<T>(object: &Map<String, Value>, fields: &'static [Field<T>]) -> usize {
    let exclusive = fields.iter().filter(|f| f.presence == Presence::Exclusive);
    exclusive.filter(|f| field(object, f.key).is_some()).count()
}

/// For a field this crate does not read whose value gRPC defines as an object: only its keys
/// are checked, and only in an object.
pub(super) fn keys_only<U>(
    value: &Value,
    path: &str,
    reader: &mut Reader,
    fields: &'static [Field<U>],
) -> Result<(), ConfigError> {
    match value {
        Value::Object(object) => reader.unknown.check(object, path, keys(fields)),
        _ => Ok(()),
    }
}

/// Sets `slot` to a value read: the end of most readers.
pub(super) fn set<V>(slot: &mut V, value: V) -> Result<(), ConfigError> {
    *slot = value;
    Ok(())
}

/// `value` written by its table: the way back of the property tests
/// (`ServiceConfig::to_json`).
pub(super) fn write<T>(fields: &'static [Field<T>], value: &T) -> Value {
    let object = fields
        .iter()
        .filter_map(|entry| Some((entry.key.to_owned(), (entry.write)(value)?)))
        .collect();
    Value::Object(object)
}

/// The reader of a field that is not read.
fn skip<T>(_: &mut T, _: &Value, _: &str, _: &mut Reader) -> Result<(), ConfigError> {
    Ok(())
}

/// The writer of a field that is not written.
fn unwritten<T>(_: &T) -> Option<Value> {
    None
}
