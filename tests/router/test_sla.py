"""SLA classes: how a request picks one (field, header, default) and ad-hoc llm-d targets."""

from __future__ import annotations

import pytest

from dspark.errors import InvalidRequestError
from router.policy import Sla
from router.sla import DEFAULT_CLASS, DEFAULT_CLASSES, SlaClass, classes_of, resolve

CLASSES = classes_of(DEFAULT_CLASSES)


def test_default_classes_and_their_targets_in_seconds():
    assert CLASSES["interactive"] == Sla("interactive", 1.0, 0.1, priority=0, may_shed=True)
    assert DEFAULT_CLASS in CLASSES and not CLASSES[DEFAULT_CLASS].may_shed
    with pytest.raises(ValueError):
        SlaClass(ttft_ms=0, tpot_ms=10)


def test_the_field_wins_over_the_header_which_wins_over_the_default():
    header = {"x-sla-class": "batch"}
    assert resolve(CLASSES, "standard", "interactive", header).name == "interactive"
    assert resolve(CLASSES, "standard", None, header).name == "batch"
    assert resolve(CLASSES, "standard", None, {}).name == "standard"


def test_an_unknown_class_is_a_400_naming_sla_class_from_field_or_header():
    for field, headers in (("gold", {}), (None, {"x-sla-class": "gold"})):
        with pytest.raises(InvalidRequestError) as err:
            resolve(CLASSES, "standard", field, headers)
        assert err.value.field == "sla_class"
        assert err.value.message == "unknown class 'gold'; configured: ['batch', 'interactive', 'standard']"


def test_llm_d_headers_set_ad_hoc_targets_on_the_class():
    sla = resolve(CLASSES, "standard", "interactive", {"x-slo-ttft-ms": "250", "x-slo-tpot-ms": "20.5"})
    assert sla == Sla("interactive", 0.25, 0.0205, priority=0, may_shed=True)
    only_tpot = resolve(CLASSES, "standard", None, {"x-slo-tpot-ms": "40"})
    assert (only_tpot.name, only_tpot.ttft_s, only_tpot.tpot_s) == ("standard", 5.0, 0.04)


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "fast", "1e12", ""])
def test_a_bad_target_header_is_a_400_naming_the_header(value):
    with pytest.raises(InvalidRequestError) as err:
        resolve(CLASSES, "standard", None, {"x-slo-ttft-ms": value})
    assert err.value.field == "x-slo-ttft-ms" and err.value.message.startswith("must be milliseconds")
