//! The `SessionActor`: one actix actor per live session, a thin shell over the coordinator.

pub(crate) mod coordinator;
