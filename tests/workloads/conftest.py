import pytest


@pytest.fixture
def wapp(url: str, namespace: str):
    from tests.apps import workloads

    workloads.app.configure(redis_url=url, namespace=namespace)
    yield workloads.app
    workloads.app.close()
