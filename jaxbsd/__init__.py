"""jaxbsd: B-spline decoupling of multivariate functions (R-CMTF-BSD) in JAX."""
