import pytest

from k2back.model import GEOMETRIES, HEAD_DIM, geometry


@pytest.mark.parametrize("name", sorted(GEOMETRIES))
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_rank_shares_sum_to_the_model(name, tp):
    g = geometry(name)
    if g.groups % tp:
        with pytest.raises(ValueError, match="tp"):
            g.rank(tp)
        return
    r = g.rank(tp)
    assert r.heads * tp == g.heads and r.groups * tp == g.groups
    assert r.wo_a_shape == (g.o_rank * g.groups // tp, 8 * HEAD_DIM)
    assert r.wo_b_shape[1] * tp == g.o_rank * g.groups
    assert r.wo_a_scale_shape == (r.wo_a_shape[0] // 32, r.wo_a_shape[1] // 32)


def test_flash_geometry_matches_spec():
    g = geometry("v4.1-flash")
    assert (g.hidden, g.heads, g.groups, g.o_rank, g.keys) == (5120, 64, 8, 1024, 640)


@pytest.mark.parametrize("bad", [3, 16, 0])
def test_bad_tp_is_named(bad):
    with pytest.raises(ValueError, match="tp"):
        geometry("v4.1-flash").rank(bad)


def test_unknown_geometry_is_named():
    with pytest.raises(ValueError, match="geometry"):
        geometry("v5")
