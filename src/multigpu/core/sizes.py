"""Byte units, from one place: binary for memory and DDP's bucket caps, decimal for
link speeds (07, 10, 12, 13)."""

KiB = 1024  # bytes in a kibibyte
MiB = 1024 * 1024  # bytes in a mebibyte: DDP's "MB" (bucket_cap_mb) means this
GiB = 1024**3  # bytes in a gibibyte
GB = 1e9  # bytes in a gigabyte: link and memory speeds are quoted in these
