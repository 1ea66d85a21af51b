"""The clean-stop marker (service/keylane/kafka/clean_stop.py): a worker keeps its table
stores across a restart only when its last run stopped with every record confirmed. The
process-level test is tests/integration/test_clean_stop.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import faust
import pytest

from keylane.catalog import load_catalog
from keylane.config import Settings
from keylane.kafka.app import build_app
from keylane.kafka.clean_stop import CLEAN_STOP_MARKER, discard_stores_after_unclean_stop, mark_clean_stop
from keylane.kafka.delivery import delivery_guard


@pytest.fixture
def app(tmp_path: Path) -> faust.App:
    return build_app(Settings.from_env({}, data_dir=tmp_path, app_id="clean-stop"), load_catalog(prefix="p."))


def stores_of(app: faust.App) -> Path:
    stores = Path(app.conf.tabledir)
    (stores / "keylane-state-0.db").mkdir(parents=True)
    return stores


async def test_a_stop_with_everything_confirmed_keeps_the_stores(app: faust.App, tmp_path: Path) -> None:
    stores = stores_of(app)
    delivered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    delivery_guard(app).track("a record", delivered)
    delivered.set_result(None)
    await asyncio.sleep(0)

    assert mark_clean_stop(app, tmp_path)
    assert not discard_stores_after_unclean_stop(app, tmp_path)
    assert (stores / "keylane-state-0.db").is_dir()
    assert not (tmp_path / CLEAN_STOP_MARKER).exists(), "a crash of the run that starts now is seen"


async def test_a_record_not_confirmed_at_the_stop_discards_the_stores(
    app: faust.App, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stores = stores_of(app)
    delivery_guard(app).track("a record", asyncio.get_running_loop().create_future())

    assert not mark_clean_stop(app, tmp_path)
    assert discard_stores_after_unclean_stop(app, tmp_path)
    assert not (stores / "keylane-state-0.db").exists()
    assert "did not stop cleanly" in caplog.text


def test_a_killed_run_leaves_no_marker_and_its_stores_go(app: faust.App, tmp_path: Path) -> None:
    stores = stores_of(app)
    (tmp_path / CLEAN_STOP_MARKER).touch()
    assert not discard_stores_after_unclean_stop(app, tmp_path)  # the start removes the marker
    # ... and the run is killed: nothing marks it.
    assert discard_stores_after_unclean_stop(app, tmp_path)
    assert not (stores / "keylane-state-0.db").exists()


def test_a_first_start_has_nothing_to_discard(
    app: faust.App, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert not discard_stores_after_unclean_stop(app, tmp_path)
    # Faust's RocksDB store makes "<table>-backups" as the table is built, before any run:
    # that is no store, and a first start says nothing of an unclean stop.
    app.conf.store = "rocksdb://"
    app.Table("first-start", default=int).data  # noqa: B018 - building the store is the point
    assert (Path(app.conf.tabledir) / "first-start-backups").is_dir()
    assert not discard_stores_after_unclean_stop(app, tmp_path)
    assert "did not stop cleanly" not in caplog.text


def test_only_the_partition_stores_and_their_records_are_discarded(app: faust.App, tmp_path: Path) -> None:
    stores = stores_of(app)
    (stores / "keylane-state-0.db.owner").write_text("{}")
    (stores / "keylane-state-backups").mkdir()
    assert discard_stores_after_unclean_stop(app, tmp_path)
    assert sorted(path.name for path in stores.iterdir()) == ["keylane-state-backups"]
