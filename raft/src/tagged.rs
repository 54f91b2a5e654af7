//! Enums persisted in the Raft log with tags fixed in the source: a variant
//! is written as its tag, then its fields in order (bincode), so adding a
//! variant never shifts the others, and a tag this build does not know is
//! a clear error instead of another variant's misread bytes.
//!
//! Tags are never reused: a variant that goes leaves its tag unused.

/// Defines `enum $name` whose struct-like variants carry explicit tags
/// (`Variant = 3 { field: Type }`), with `Serialize` and `Deserialize`
/// writing each variant as its tag and a tuple of its fields.
macro_rules! tagged_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $(
                $(#[$vmeta:meta])*
                $variant:ident = $tag:literal {
                    $( $(#[$fmeta:meta])* $field:ident : $fty:ty ),* $(,)?
                }
            ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis enum $name {
            $(
                $(#[$vmeta])*
                $variant { $( $(#[$fmeta])* $field: $fty ),* },
            )*
        }

        impl $name {
            /// Every tag, in declaration order (tests check they are distinct).
            #[allow(dead_code)]
            pub const TAGS: &'static [u32] = &[$($tag),*];

            /// This variant's tag.
            pub fn tag(&self) -> u32 {
                match self {
                    $( $name::$variant { .. } => $tag, )*
                }
            }

            /// This variant's name, for logs.
            pub fn name(&self) -> &'static str {
                match self {
                    $( $name::$variant { .. } => stringify!($variant), )*
                }
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                match self {
                    $(
                        $name::$variant { $($field),* } => s.serialize_newtype_variant(
                            stringify!($name),
                            $tag,
                            stringify!($variant),
                            &( $($field,)* ),
                        ),
                    )*
                }
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct Tagged;
                impl<'de> serde::de::Visitor<'de> for Tagged {
                    type Value = $name;

                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        write!(f, "a tagged {}", stringify!($name))
                    }

                    fn visit_enum<A: serde::de::EnumAccess<'de>>(
                        self,
                        data: A,
                    ) -> Result<$name, A::Error> {
                        use serde::de::VariantAccess;
                        let (tag, body): (u32, _) = data.variant()?;
                        match tag {
                            $(
                                $tag => {
                                    let ( $($field,)* ): ( $($fty,)* ) = body.newtype_variant()?;
                                    Ok($name::$variant { $($field),* })
                                }
                            )*
                            other => Err(serde::de::Error::custom(format_args!(
                                "unknown {} tag {other}: written by a newer build of Crescent?",
                                stringify!($name)
                            ))),
                        }
                    }
                }
                d.deserialize_enum(stringify!($name), &[$(stringify!($variant)),*], Tagged)
            }
        }
    };
}

pub(crate) use tagged_enum;

#[cfg(test)]
mod tests {
    use crate::codec;
    use crate::state::Op;

    #[test]
    fn each_op_is_written_as_its_own_fixed_tag_then_its_fields() {
        let mut tags = Op::TAGS.to_vec();
        tags.sort_unstable();
        tags.dedup();
        assert_eq!(tags.len(), Op::TAGS.len(), "a tag is used twice");

        let op = Op::LeaderStart { term: 5 };
        let bytes = codec::encode(&op).unwrap();
        // bincode writes a small tag, and the small term, in one byte each.
        assert_eq!(bytes, vec![7, 5]);
        assert_eq!(codec::decode::<Op>(&bytes).unwrap(), op);
        assert_eq!(op.tag(), 7);

        let none = Op::ReclaimStalePuts {};
        assert_eq!(codec::encode(&none).unwrap(), vec![10]);
        assert_eq!(codec::decode::<Op>(&[10]).unwrap(), none);
    }

    #[test]
    fn a_tag_this_build_does_not_know_is_an_error_naming_it() {
        let err = codec::decode::<Op>(&[200]).unwrap_err().to_string();
        assert!(err.contains("unknown Op tag 200"), "{err}");
    }
}
