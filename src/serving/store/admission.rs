//! Admission to the store: which new tensors an insert stores at all.
//!
//! An insert proposes the tensors of a prompt beyond its stored prefix; admission decides,
//! tensor by tensor from the first, whether each is worth the room it takes. A refused
//! tensor ends the insert there (what follows it in the prompt would be unreachable without
//! it). `always` stores everything, as EvoStore and PTStore do.

/// The admission rule of a store (`admission` in a policy's table).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Admission {
    /// Store every new tensor.
    #[default]
    Always,
}
