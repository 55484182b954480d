"""The console's rollout page and form with the shadow phase and the accuracy gates: the
page lays out a rollout in its shadow phase (its statuses, its agreement against the
threshold), the form turns its shadow and accuracy fields into the spec."""

from __future__ import annotations

import pytest

from fleet_server.rollout import LabelCounts, LabelReport, Phase, RolloutError
from fleet_server.web.rolloutform import RolloutForm
from fleet_server.web.rolloutview import rollout_page
from tests.fleet_server.test_rollout_shadow import _fleet, _spec


def test_the_page_of_a_rollout_in_its_shadow_phase_shows_the_agreement_row() -> None:
    f = _fleet(4, _spec(policy={"gates": {"min_accuracy": 0.9}}))
    f.tick()
    f.answer()
    f.frames(200)
    f.send(LabelReport(f.now, LabelCounts(30, 30)))
    assert f.r.phase is Phase.SHADOW
    page = rollout_page(f.r)
    assert page.phase == "shadow"
    assert "shadow" in page.phase_text
    rows = {g.check: g for g in page.gates}
    agreement = rows["Shadow agreement (lower bound)"]
    assert agreement.threshold == "≥ 0.97"
    assert agreement.verdict == "within"  # 200 of 200 agree: lower bound ~0.981
    assert "n=200 (need 500)" in agreement.note
    assert rows["Shadow p99"].verdict == "within"
    accuracy = rows["Labelled accuracy (lower bound)"]
    assert accuracy.verdict == "no data"
    assert "waiting: 30 of 100 labels" in accuracy.note
    assert [d.status for d in page.devices].count("shadowing") == 1
    assert "shadowing" in str(page.overall)


def test_the_form_turns_shadow_and_accuracy_fields_into_the_spec() -> None:
    form = RolloutForm(
        rollout_id="ro-0123456789ab", bundle="det@2.0.0", selector="*", shadow="2h",
        shadow_min="300",
        min_agreement="0.95", min_accuracy="0.9", min_labels="50", accuracy_drop="",
    )  # fmt: skip
    spec = form.spec()
    assert (spec.shadow_s, spec.shadow_min, spec.min_agreement) == (7200, 300, 0.95)
    gates = spec.policy.gates
    assert (gates.min_accuracy, gates.min_labels, gates.accuracy_drop) == (0.9, 50, None)
    plain = RolloutForm(rollout_id="ro-0123456789ab", bundle="det@2.0.0", selector="*").spec()
    assert (plain.shadow_s, plain.shadow_min, plain.policy.gates.min_accuracy) == (0, 500, None)
    with pytest.raises(RolloutError) as err:
        RolloutForm(
            rollout_id="ro-0123456789ab", bundle="det@2.0.0", selector="*", min_labels="many"
        ).spec()
    assert err.value.field == "policy.gates.min_labels"
    with pytest.raises(RolloutError) as blank:  # a new form selects no device
        RolloutForm(rollout_id="ro-0123456789ab", bundle="det@2.0.0").spec()
    assert blank.value.field == "selector"
