//! Conversions to and from `ndarray::ArrayD` (feature `ndarray`).

use nx_mesh::Device;

use crate::{Array, Element, Result};

impl<T: Element> Array<T> {
    /// The elements as an `ndarray::ArrayD` of the same shape (a copy, C order).
    ///
    /// # Errors
    /// As [`Array::to_vec`].
    pub fn to_ndarray(&self) -> Result<ndarray::ArrayD<T>> {
        let v = self.to_vec()?;
        Ok(ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(self.shape()), v).expect("one element per index"))
    }

    /// A fresh C-contiguous array on `device` holding `a`'s elements.
    ///
    /// # Errors
    /// As [`Array::from_vec`].
    pub fn from_ndarray(device: Device, a: &ndarray::ArrayD<T>) -> Result<Array<T>> {
        Array::from_vec(device, a.shape(), a.iter().copied().collect())
    }
}
