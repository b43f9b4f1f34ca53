"""The standard grpc.health.v1 Check call, encoded by hand so the SDK needs no extra package.

HealthCheckRequest is `{string service = 1}` and HealthCheckResponse `{ServingStatus status = 1}`; the
full schema lives in grpcio-health-checking, which servers use (and which a client could use as well).
"""

from __future__ import annotations

CHECK_METHOD = "/grpc.health.v1.Health/Check"
STATUS_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def encode_request(service: str) -> bytes:
    data = service.encode()
    return b"\x0a" + _varint(len(data)) + data if data else b""


def decode_response(data: bytes) -> str:
    status, i = 0, 0
    while i < len(data):
        key, i = _read_varint(data, i)
        if key & 7 != 0:  # only varint fields exist in this message
            raise ValueError("malformed HealthCheckResponse")
        value, i = _read_varint(data, i)
        if key >> 3 == 1:
            status = value
    return STATUS_NAMES.get(status, "UNKNOWN")


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7
