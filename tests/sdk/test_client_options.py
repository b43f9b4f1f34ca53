"""SDK behaviour against an in-process fake server: retries keyed by request id, tokens, TLS, health."""

from __future__ import annotations

import datetime
import subprocess
import sys
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from serving import free_port

import dspark_client
from dspark_client.proto import add_GenerationServicer_to_server, pb, pb_grpc


class FlakyGeneration(pb_grpc.GenerationServicer):
    """Refuses the first `failures` calls of each kind, then answers; records what arrived."""

    def __init__(self, failures: int = 2, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> None:
        self.failures, self.code = failures, code
        self.generate_ids: list[str] = []
        self.metadata: list[dict] = []
        self.info_calls = 0

    def Generate(self, request, context):
        self.generate_ids.append(request.request_id)
        self.metadata.append(dict(context.invocation_metadata()))
        if len(self.generate_ids) <= self.failures:
            context.abort(self.code, "busy; retry in 0.01s")
        yield pb.GenerateResponse(request_id=request.request_id, delta=pb.Delta(text="ok", token_ids=[1]))
        yield pb.GenerateResponse(
            request_id=request.request_id,
            final=pb.Final(
                finish_reason="length", usage=pb.Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2)
            ),
        )

    def GetModelInfo(self, request, context):
        self.info_calls += 1
        if self.info_calls <= self.failures:
            context.abort(self.code, "busy")
        return pb.ModelInfo(model="fake", max_model_len=8)


def serve(servicer, credentials=None):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    add_GenerationServicer_to_server(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = free_port()
    if credentials is None:
        server.add_insecure_port(f"127.0.0.1:{port}")
    else:
        server.add_secure_port(f"127.0.0.1:{port}", credentials)
    server.start()
    return server, f"127.0.0.1:{port}"


FAST = dspark_client.RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.05)


def test_generate_retries_unavailable_with_the_same_request_id():
    servicer = FlakyGeneration(failures=2)
    server, target = serve(servicer)
    try:
        with dspark_client.Client(target, retry=FAST, token="s3cret") as client:
            out = client.generate("hi", request_id="rid-7")
        assert out.text == "ok" and out.finish_reason == "length"
        assert servicer.generate_ids == ["rid-7"] * 3
        assert all(m["authorization"] == "Bearer s3cret" for m in servicer.metadata)
    finally:
        server.stop(None)


def test_retries_stop_at_max_attempts_and_raise_typed():
    servicer = FlakyGeneration(failures=5, code=grpc.StatusCode.RESOURCE_EXHAUSTED)
    server, target = serve(servicer)
    try:
        with dspark_client.Client(target, retry=FAST) as client:
            with pytest.raises(dspark_client.ResourceExhaustedError) as err:
                client.generate("hi")
        assert len(servicer.generate_ids) == 3 and err.value.retry_after_s == 0.01
    finally:
        server.stop(None)


def test_no_retry_for_invalid_argument_and_unary_retries():
    servicer = FlakyGeneration(failures=1, code=grpc.StatusCode.INVALID_ARGUMENT)
    server, target = serve(servicer)
    try:
        with dspark_client.Client(target, retry=FAST) as client:
            with pytest.raises(dspark_client.InvalidArgumentError):
                client.generate("hi")
            assert len(servicer.generate_ids) == 1
        servicer.code, servicer.info_calls = grpc.StatusCode.UNAVAILABLE, 0
        with dspark_client.Client(target, retry=FAST) as client:
            assert client.model_info().model == "fake" and servicer.info_calls == 2
            assert client.health() == "SERVING"
    finally:
        server.stop(None)


def test_async_client_retries():
    import asyncio

    servicer = FlakyGeneration(failures=2)
    server, target = serve(servicer)

    async def run():
        async with dspark_client.AsyncClient(target, retry=FAST) as client:
            return await client.generate("hi", request_id="a-1")

    try:
        assert asyncio.run(run()).text == "ok"
        assert servicer.generate_ids == ["a-1"] * 3
    finally:
        server.stop(None)


def _self_signed() -> tuple[bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


def test_tls_with_a_bearer_token():
    pytest.importorskip("cryptography")
    key, cert = _self_signed()
    servicer = FlakyGeneration(failures=0)
    server, target = serve(servicer, grpc.ssl_server_credentials([(key, cert)]))
    try:
        options = (("grpc.ssl_target_name_override", "localhost"),)
        with dspark_client.Client(
            target, root_certificates=cert, token="t", channel_options=options
        ) as client:
            assert client.generate("hi").text == "ok"
        assert servicer.metadata[0]["authorization"] == "Bearer t"
    finally:
        server.stop(None)


def test_health_codec_round_trip():
    from dspark_client import health as codec

    assert codec.encode_request("") == b""
    assert health_pb2.HealthCheckRequest.FromString(codec.encode_request("dspark.v1.Generation")).service == (
        "dspark.v1.Generation"
    )
    raw = health_pb2.HealthCheckResponse(
        status=health_pb2.HealthCheckResponse.NOT_SERVING
    ).SerializeToString()
    assert codec.decode_response(raw) == "NOT_SERVING"


def test_sdk_imports_neither_torch_nor_ray():
    code = (
        "import sys, dspark_client; bad = {'torch', 'ray', 'dspark'} & set(sys.modules); assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
