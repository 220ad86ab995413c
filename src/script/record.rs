//! A record (a serde struct) as a script's map, built from a template of its keys.
//!
//! rhai's serializer inserts a struct's fields into the map (a `BTreeMap`) one by one, each
//! insert comparing keys down the tree: about 12,000 instructions for a GPU record's 14
//! fields. Here each struct shape (its name and the keys it serialized) gets a map of those
//! keys once per thread; a record's map is a clone of it, with the values put in key order.
//! The map is the same, for a fraction of the work: `gpu()` over 64 hosts builds 512 a call.
//! What is not a struct, or a struct whose keys repeat, goes through rhai's serializer.

use super::convert::RhaiResult;
use rhai::{Dynamic, EvalAltResult, Identifier, Map};
use serde::ser::{self, Impossible, Serialize, Serializer};
use std::cell::RefCell;

/// `v` as rhai's `to_dynamic` makes it: a struct becomes a map of its serialized fields.
pub(super) fn to_dynamic<T: Serialize + ?Sized>(v: &T) -> RhaiResult<Dynamic> {
    match v.serialize(Shape) {
        Ok(fields) => Ok(fields.into_map()),
        Err(Error::NotAStruct) => rhai::serde::to_dynamic(v),
        Err(Error::Rhai(e)) => Err(e),
    }
}

/// The keys of one struct shape as a map of `()`, and where each serialized field goes.
struct Template {
    name: &'static str,
    /// In the order the struct serializes them.
    keys: Vec<&'static str>,
    map: Map,
    /// `order[i]`: the field whose value is the map's i-th (in key order).
    order: Vec<usize>,
}

/// Shapes seen on this thread; past this many, they start again (a guard, not a limit any
/// record type comes near: one shape per struct and optional field left out).
const MAX_TEMPLATES: usize = 64;

thread_local! {
    static TEMPLATES: RefCell<Vec<Template>> = const { RefCell::new(Vec::new()) };
}

impl Template {
    /// None when keys repeat (the map would have fewer entries than fields).
    fn new(name: &'static str, keys: &[&'static str]) -> Option<Template> {
        let map: Map = keys
            .iter()
            .map(|k| (Identifier::from(*k), Dynamic::UNIT))
            .collect();
        if map.len() != keys.len() {
            return None;
        }
        let mut order: Vec<usize> = (0..keys.len()).collect();
        order.sort_by_key(|&i| keys[i]);
        Some(Template {
            name,
            keys: keys.to_vec(),
            map,
            order,
        })
    }

    fn fits(&self, name: &'static str, keys: &[&'static str]) -> bool {
        self.name == name
            && self.keys.len() == keys.len()
            && self.keys.iter().zip(keys).all(|(a, b)| a == b)
    }
}

/// A struct's fields as serialized, in order.
struct Fields {
    name: &'static str,
    keys: Vec<&'static str>,
    values: Vec<Dynamic>,
}

impl Fields {
    fn into_map(mut self) -> Dynamic {
        TEMPLATES.with(|cell| {
            let mut templates = cell.borrow_mut();
            let found = templates.iter().position(|t| t.fits(self.name, &self.keys));
            let i = match found {
                Some(i) => i,
                None => match Template::new(self.name, &self.keys) {
                    Some(t) => {
                        if templates.len() == MAX_TEMPLATES {
                            templates.clear();
                        }
                        templates.push(t);
                        templates.len() - 1
                    }
                    // Repeated keys: the last one wins, as with rhai's inserts.
                    None => {
                        let map: Map = self
                            .keys
                            .iter()
                            .map(|k| Identifier::from(*k))
                            .zip(self.values)
                            .collect();
                        return Dynamic::from_map(map);
                    }
                },
            };
            let t = &templates[i];
            let mut map = t.map.clone();
            for (slot, &field) in map.values_mut().zip(&t.order) {
                *slot = std::mem::take(&mut self.values[field]);
            }
            Dynamic::from_map(map)
        })
    }
}

enum Error {
    NotAStruct,
    Rhai(Box<EvalAltResult>),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::NotAStruct => f.write_str("not a struct"),
            Error::Rhai(e) => e.fmt(f),
        }
    }
}

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for Error {}

impl ser::Error for Error {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        Error::Rhai(super::convert::script_err(msg.to_string()))
    }
}

/// Takes a struct; anything else is `NotAStruct`.
struct Shape;

macro_rules! not_a_struct {
    ($($method:ident($($arg:ty),*) -> $ret:ty;)*) => {
        $(fn $method(self, $(_: $arg),*) -> Result<$ret, Error> {
            Err(Error::NotAStruct)
        })*
    };
}

impl Serializer for Shape {
    type Ok = Fields;
    type Error = Error;
    type SerializeSeq = Impossible<Fields, Error>;
    type SerializeTuple = Impossible<Fields, Error>;
    type SerializeTupleStruct = Impossible<Fields, Error>;
    type SerializeTupleVariant = Impossible<Fields, Error>;
    type SerializeMap = Impossible<Fields, Error>;
    type SerializeStruct = Fields;
    type SerializeStructVariant = Impossible<Fields, Error>;

    fn serialize_struct(self, name: &'static str, len: usize) -> Result<Fields, Error> {
        Ok(Fields {
            name,
            keys: Vec::with_capacity(len),
            values: Vec::with_capacity(len),
        })
    }

    not_a_struct! {
        serialize_bool(bool) -> Fields;
        serialize_i8(i8) -> Fields;
        serialize_i16(i16) -> Fields;
        serialize_i32(i32) -> Fields;
        serialize_i64(i64) -> Fields;
        serialize_u8(u8) -> Fields;
        serialize_u16(u16) -> Fields;
        serialize_u32(u32) -> Fields;
        serialize_u64(u64) -> Fields;
        serialize_f32(f32) -> Fields;
        serialize_f64(f64) -> Fields;
        serialize_char(char) -> Fields;
        serialize_str(&str) -> Fields;
        serialize_bytes(&[u8]) -> Fields;
        serialize_none() -> Fields;
        serialize_unit() -> Fields;
        serialize_unit_struct(&'static str) -> Fields;
        serialize_unit_variant(&'static str, u32, &'static str) -> Fields;
        serialize_seq(Option<usize>) -> Self::SerializeSeq;
        serialize_tuple(usize) -> Self::SerializeTuple;
        serialize_tuple_struct(&'static str, usize) -> Self::SerializeTupleStruct;
        serialize_tuple_variant(&'static str, u32, &'static str, usize) -> Self::SerializeTupleVariant;
        serialize_map(Option<usize>) -> Self::SerializeMap;
        serialize_struct_variant(&'static str, u32, &'static str, usize) -> Self::SerializeStructVariant;
    }

    fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<Fields, Error> {
        Err(Error::NotAStruct)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: &T,
    ) -> Result<Fields, Error> {
        Err(Error::NotAStruct)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<Fields, Error> {
        Err(Error::NotAStruct)
    }
}

impl ser::SerializeStruct for Fields {
    type Ok = Fields;
    type Error = Error;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.keys.push(key);
        self.values
            .push(rhai::serde::to_dynamic(value).map_err(Error::Rhai)?);
        Ok(())
    }

    fn end(self) -> Result<Fields, Error> {
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;

    #[derive(Serialize)]
    struct Inner {
        b: i64,
        a: String,
    }

    #[derive(Serialize)]
    struct Rec {
        zeta: i64,
        alpha: String,
        mid: Option<i64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        maybe: Option<String>,
        list: Vec<Inner>,
        inner: Inner,
        #[serde(rename = "Upper")]
        upper: bool,
    }

    fn rec(i: i64, maybe: Option<&str>) -> Rec {
        Rec {
            zeta: i,
            alpha: format!("a{i}"),
            mid: (i % 2 == 0).then_some(i),
            maybe: maybe.map(str::to_string),
            list: vec![Inner {
                b: i,
                a: "x".into(),
            }],
            inner: Inner {
                b: -i,
                a: "y".into(),
            },
            upper: i > 1,
        }
    }

    /// The same map as rhai's serializer makes, for every shape, reused or not, and for
    /// what is not a struct.
    #[test]
    fn maps_equal_rhais_for_every_shape_and_reuse() {
        let render = |d: &Dynamic| format!("{d:?}");
        for i in 0..4 {
            for maybe in [None, Some("m")] {
                let r = rec(i, maybe);
                let ours = to_dynamic(&r).unwrap();
                let theirs = rhai::serde::to_dynamic(&r).unwrap();
                assert_eq!(render(&ours), render(&theirs));
                let m = ours.as_map_ref().unwrap();
                assert_eq!(m.contains_key("maybe"), maybe.is_some());
                assert_eq!(m["zeta"].as_int().unwrap(), i);
            }
        }
        for v in [Dynamic::from(3_i64), Dynamic::from("s")] {
            let theirs = render(&rhai::serde::to_dynamic(&v).unwrap());
            assert_eq!(render(&to_dynamic(&v).unwrap()), theirs);
        }
        let list = vec![rec(1, None), rec(2, Some("q"))];
        assert_eq!(
            render(&to_dynamic(&list).unwrap()),
            render(&rhai::serde::to_dynamic(&list).unwrap())
        );
    }

    #[derive(Serialize)]
    struct Twice {
        a: i64,
        #[serde(rename = "a")]
        b: i64,
    }

    #[test]
    fn repeated_keys_keep_the_last_value_as_rhai_does() {
        let t = Twice { a: 1, b: 2 };
        let ours = to_dynamic(&t).unwrap();
        assert_eq!(
            format!("{ours:?}"),
            format!("{:?}", rhai::serde::to_dynamic(&t).unwrap())
        );
        assert_eq!(ours.as_map_ref().unwrap()["a"].as_int().unwrap(), 2);
    }
}
