"""st_write.py - writes a safetensors file by hand, for the reference
scripts here (gpt2_torch.py, llama_torch.py): /usr/bin/python3, Debian's,
has torch but no safetensors module.

The format is all here: an 8-byte little-endian header length N, N bytes
of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}} (offsets
into the data that follows; padded with spaces to a multiple of 8, as the
safetensors library pads), then each tensor's raw little-endian bytes.
"""
import json
import struct

import numpy as np

DTYPES = {np.dtype("<f4"): "F32", np.dtype("<f8"): "F64"}


def save(tensors, path):
    """tensors: {name: torch tensor or numpy array}, f32 or f64."""
    header, blobs, at = {}, [], 0
    for name, t in tensors.items():
        a = t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)
        a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
        blob = a.tobytes()
        header[name] = {"dtype": DTYPES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [at, at + len(blob)]}
        blobs.append(blob)
        at += len(blob)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for blob in blobs:
            f.write(blob)
