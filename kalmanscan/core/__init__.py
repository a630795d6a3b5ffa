"""Math and ops: discretization, the Möbius and affine scans, the filter and smoother API."""
