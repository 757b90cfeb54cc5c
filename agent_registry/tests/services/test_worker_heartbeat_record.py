import pytest

from agent_registry import services
from agent_registry.models import WorkerHeartbeat

pytestmark = pytest.mark.django_db


def test_the_first_beat_creates_the_row_and_later_beats_count():
    services.worker_heartbeat_record(hostname="worker-1")
    first_seen = WorkerHeartbeat.objects.get(hostname="worker-1").last_seen_at

    services.worker_heartbeat_record(hostname="worker-1")
    services.worker_heartbeat_record(hostname="worker-2")

    assert sorted(WorkerHeartbeat.objects.values_list("hostname", "beats")) == [("worker-1", 2), ("worker-2", 1)]
    assert WorkerHeartbeat.objects.get(hostname="worker-1").last_seen_at >= first_seen
