//! `PlacementSpec`: a placement without a brand — text form, serde, and branding with `over`.

use std::fmt;
use std::str::FromStr;

use nx_mesh::{Devices, Mesh};

use crate::{Error, Placement, Result};

/// A placement's text, not yet laid over a set: what configuration files, serde and the command
/// line hold. [`PlacementSpec::over`] brands it.
///
/// Text form (`Display` prints this canonical spelling, `FromStr` also takes any spacing):
/// `on`, `device(K)` (K the device's position in the set), `split(A)`, `mesh(A:x.y, B:z)`
/// (tensor axis A cut over mesh axes x then y), `mesh()`, `partial(x.y; A:z)` (a sum over x and
/// y, axis A cut over z), `partial(x.y)`. A partial spec with no sums reads as the mesh spec of
/// its cuts, as `Placement::partial` makes it.
///
/// ```
/// use nx_placement::PlacementSpec;
///
/// let p: PlacementSpec = "partial( tp ;0: dp.pp )".parse().unwrap();
/// assert_eq!(p.to_string(), "partial(tp; 0:dp.pp)");
/// let err = "mesh(0:dp,".parse::<PlacementSpec>().unwrap_err();
/// assert!(err.to_string().contains("column 11"), "{err}");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PlacementSpec {
    /// `on`: the whole value on every device.
    On,
    /// `device(K)`: the whole value on the set's device K alone.
    Device(usize),
    /// `split(A)`: axis A cut over the set's devices in order.
    Split(usize),
    /// `mesh(A:x.y, …)`: each listed tensor axis cut over the named mesh axes.
    Mesh {
        /// (tensor axis, mesh axis names, major first).
        cuts: Vec<(usize, Vec<String>)>,
    },
    /// `partial(x.y; A:z, …)`: a sum over the mesh axes `sums`, cut as `cuts`.
    Partial {
        /// The summed mesh axes, in term order (the first major).
        sums: Vec<String>,
        /// (tensor axis, mesh axis names, major first).
        cuts: Vec<(usize, Vec<String>)>,
    },
}

fn write_cuts(f: &mut fmt::Formatter<'_>, cuts: &[(usize, Vec<String>)]) -> fmt::Result {
    for (i, (axis, names)) in cuts.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write!(f, "{axis}:{}", names.join("."))?;
    }
    Ok(())
}

impl fmt::Display for PlacementSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlacementSpec::On => f.write_str("on"),
            PlacementSpec::Device(k) => write!(f, "device({k})"),
            PlacementSpec::Split(a) => write!(f, "split({a})"),
            PlacementSpec::Mesh { cuts } => {
                f.write_str("mesh(")?;
                write_cuts(f, cuts)?;
                f.write_str(")")
            }
            PlacementSpec::Partial { sums, cuts } => {
                write!(f, "partial({}", sums.join("."))?;
                if !cuts.is_empty() {
                    f.write_str("; ")?;
                    write_cuts(f, cuts)?;
                }
                f.write_str(")")
            }
        }
    }
}

struct Cursor<'t> {
    text: &'t str,
    pos: usize,
}

impl<'t> Cursor<'t> {
    fn err(&self, why: impl Into<String>) -> Error {
        Error::Parse { text: self.text.to_string(), column: self.pos + 1, why: why.into() }
    }
    fn skip_space(&mut self) {
        while self.text[self.pos..].starts_with(char::is_whitespace) {
            self.pos += self.text[self.pos..].chars().next().map_or(1, char::len_utf8);
        }
    }
    fn peek(&mut self) -> Option<char> {
        self.skip_space();
        self.text[self.pos..].chars().next()
    }
    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }
    fn expect(&mut self, c: char) -> Result<()> {
        if self.eat(c) {
            Ok(())
        } else {
            let found = self.peek().map_or("the end".to_string(), |f| format!("{f:?}"));
            Err(self.err(format!("expected {c:?}, found {found}")))
        }
    }
    fn word(&mut self) -> &'t str {
        self.skip_space();
        let rest = &self.text[self.pos..];
        let len = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
        self.pos += len;
        &rest[..len]
    }
    fn number(&mut self, what: &str) -> Result<usize> {
        let at = self.pos;
        let w = self.word();
        w.parse().map_err(|_| {
            self.pos = at;
            self.skip_space();
            self.err(format!("expected {what} (a whole number), found {w:?}"))
        })
    }
    fn name(&mut self) -> Result<String> {
        self.skip_space();
        let at = self.pos;
        let w = self.word();
        if w.is_empty() || w.starts_with(|c: char| c.is_ascii_digit()) {
            self.pos = at;
            return Err(self.err(format!("expected a mesh axis name, found {w:?}")));
        }
        Ok(w.to_string())
    }
    fn names(&mut self) -> Result<Vec<String>> {
        let mut out = vec![self.name()?];
        while self.eat('.') {
            out.push(self.name()?);
        }
        Ok(out)
    }
    /// `A:x.y, B:z` up to (not eating) `)`.
    fn cuts(&mut self) -> Result<Vec<(usize, Vec<String>)>> {
        let mut cuts = Vec::new();
        if self.peek() == Some(')') {
            return Ok(cuts);
        }
        loop {
            let axis = self.number("a tensor axis")?;
            self.expect(':')?;
            cuts.push((axis, self.names()?));
            if !self.eat(',') {
                return Ok(cuts);
            }
        }
    }
}

impl FromStr for PlacementSpec {
    type Err = Error;

    /// Reads the text form; an error names the 1-based column of the problem.
    fn from_str(text: &str) -> Result<PlacementSpec> {
        let mut c = Cursor { text, pos: 0 };
        let head_at = {
            c.skip_space();
            c.pos
        };
        let head = c.word();
        let spec = match head {
            "on" => PlacementSpec::On,
            "device" => {
                c.expect('(')?;
                let k = c.number("a device position")?;
                c.expect(')')?;
                PlacementSpec::Device(k)
            }
            "split" => {
                c.expect('(')?;
                let a = c.number("a tensor axis")?;
                c.expect(')')?;
                PlacementSpec::Split(a)
            }
            "mesh" => {
                c.expect('(')?;
                let cuts = c.cuts()?;
                c.expect(')')?;
                PlacementSpec::Mesh { cuts }
            }
            "partial" => {
                c.expect('(')?;
                let sums = if matches!(c.peek(), Some(';') | Some(')')) { Vec::new() } else { c.names()? };
                let cuts = if c.eat(';') { c.cuts()? } else { Vec::new() };
                c.expect(')')?;
                if sums.is_empty() {
                    PlacementSpec::Mesh { cuts }
                } else {
                    PlacementSpec::Partial { sums, cuts }
                }
            }
            other => {
                c.pos = head_at;
                return Err(c.err(format!("expected on, device(K), split(A), mesh(…) or partial(…), found {other:?}")));
            }
        };
        if let Some(extra) = c.peek() {
            return Err(c.err(format!("unexpected {extra:?} after the placement")));
        }
        Ok(spec)
    }
}

impl serde::Serialize for PlacementSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for PlacementSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

fn borrow(cuts: &[(usize, Vec<String>)]) -> Vec<(usize, Vec<&str>)> {
    cuts.iter().map(|(a, n)| (*a, n.iter().map(String::as_str).collect())).collect()
}

impl PlacementSpec {
    /// This spec laid over `mesh`: `on`, `device` and `split` over the mesh's set (and its flat
    /// mesh), `mesh` and `partial` over `mesh` itself.
    ///
    /// # Errors
    /// The errors of the placement function the spec names (an unknown mesh axis, a device
    /// position past the set, …).
    pub fn over<'d>(&self, mesh: &Mesh<'d>) -> Result<Placement<'d>> {
        match self {
            PlacementSpec::On => Ok(Placement::on(mesh.devices())),
            PlacementSpec::Device(k) => Placement::device(mesh.devices(), *k),
            PlacementSpec::Split(a) => Placement::split(*a, mesh.devices()),
            PlacementSpec::Mesh { cuts } => {
                let b = borrow(cuts);
                let c: Vec<(usize, &[&str])> = b.iter().map(|(a, n)| (*a, n.as_slice())).collect();
                Placement::mesh(mesh, &c)
            }
            PlacementSpec::Partial { sums, cuts } => {
                let b = borrow(cuts);
                let c: Vec<(usize, &[&str])> = b.iter().map(|(a, n)| (*a, n.as_slice())).collect();
                let s: Vec<&str> = sums.iter().map(String::as_str).collect();
                Placement::partial(mesh, &s, &c)
            }
        }
    }

    /// This spec laid over `devices`, whose mesh is the flat `x=n` ([`Mesh::flat`]).
    ///
    /// # Errors
    /// As [`PlacementSpec::over`]; a mesh axis other than `x` is unknown.
    pub fn over_devices<'d>(&self, devices: &Devices<'d>) -> Result<Placement<'d>> {
        self.over(&Mesh::flat(devices))
    }
}
