//! The names of all method configs, indexed to find the config of a call.

use std::collections::HashMap;

use super::{ConfigError, MethodName, Rule};

/// Where a name was found: method config `config`, name `name` within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Slot {
    pub(super) config: usize,
    pub(super) name: usize,
}

/// The names within one service: the whole service, and its methods.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct ServiceSlots {
    whole: Option<Slot>,
    methods: HashMap<String, Slot>,
}

/// The names of all method configs, for lookups without allocation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct NameIndex {
    default: Option<Slot>,
    services: HashMap<String, ServiceSlots>,
}

impl NameIndex {
    /// Adds `name`, found at `slot`; an error when the name is already in the index, naming
    /// both places by their `path`.
    pub(super) fn insert(
        &mut self,
        name: &MethodName,
        slot: Slot,
        path: impl Fn(Slot) -> String,
    ) -> Result<(), ConfigError> {
        let existing = if name.is_default() {
            match self.default {
                Some(first) => {
                    return Err(ConfigError::new(
                        path(slot),
                        Rule::DuplicateDefault { first: path(first) },
                    ));
                }
                None => &mut self.default,
            }
        } else {
            let service = self.services.entry(name.service.clone()).or_default();
            match &name.method {
                None => &mut service.whole,
                Some(method) => {
                    if let Some(first) = service.methods.get(method) {
                        return Err(ConfigError::new(
                            path(slot),
                            Rule::DuplicateName {
                                first: path(*first),
                            },
                        ));
                    }
                    service.methods.insert(method.clone(), slot);
                    return Ok(());
                }
            }
        };
        if let Some(first) = existing {
            return Err(ConfigError::new(
                path(slot),
                Rule::DuplicateName {
                    first: path(*first),
                },
            ));
        }
        *existing = Some(slot);
        Ok(())
    }

    /// The slot of the most specific name for `method` of `service`: that exact method,
    /// else the whole service, else the default, else none.
    pub(super) fn find(&self, service: &str, method: &str) -> Option<Slot> {
        let named = self
            .services
            .get(service)
            .and_then(|slots| slots.methods.get(method).copied().or(slots.whole));
        named.or(self.default)
    }

    /// The slot of the default name, if any.
    pub(super) fn find_default(&self) -> Option<Slot> {
        self.default
    }
}
