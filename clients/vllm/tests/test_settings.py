"""The load format's settings, from vLLM's extra loader config over the environment."""

import pytest
from ztserve_vllm import settings


def test_the_extra_config_wins_over_the_environment_and_integers_are_checked():
    parsed = settings.parse({"url": "http://a:1", "concurrency": 2}, {"ZTSERVE_URL": "http://b:2", "ZTSERVE_CHUNK_SIZE": "65536",
                                                                      "ZTSERVE_REQUEST_BYTES": "1048576"})
    assert parsed == {
        "url": "http://a:1", "concurrency": 2, "chunk_size": 65536, "prefetch_bytes": settings.PREFETCH_BYTES,
        "request_bytes": 1 << 20, "hub_namespace": settings.HUB_NAMESPACE, "strict": False,
        "outage_secs": settings.OUTAGE_SECS,
    }
    defaults = settings.parse({"url": "http://a:1"}, {})
    assert (defaults["concurrency"], defaults["request_bytes"]) == (settings.CONCURRENCY, settings.REQUEST_BYTES)
    assert settings.parse(None, {"ZTSERVE_URL": "http://b:2", "HF_TOKEN": "t"})["token"] == "t"
    assert settings.parse({"token": "mine"}, {"ZTSERVE_URL": "http://b:2", "HF_TOKEN": "t"})["token"] == "mine"


@pytest.mark.parametrize("extra, environ, message", [
    ({}, {}, "needs the server's URL"),
    ({"url": "http://a", "threads": 2}, {}, r"unexpected extra config keys for load format ztserve: \['threads'\]"),
    ({"url": "http://a", "concurrency": "many"}, {}, "concurrency must be an integer"),
    ({"url": "http://a", "concurrency": True}, {}, "concurrency must be an integer"),
    ({"url": "http://a"}, {"ZTSERVE_PREFETCH_BYTES": "0"}, "prefetch_bytes must be at least 1"),
    ({"url": "http://a", "request_bytes": 0}, {}, "request_bytes must be at least 1"),
    ({"url": ""}, {}, "url must be a non-empty string"),
    ({"url": "http://a", "strict": "maybe"}, {}, "strict must be true or false"),
    ({"url": "http://a", "strict": 1}, {}, "strict must be true or false"),
    ("url=http://a", {}, "must be a dict"),
])
def test_bad_settings_are_refused_before_anything_loads(extra, environ, message):
    with pytest.raises(ValueError, match=message):
        settings.parse(extra, environ)


def test_strict_is_a_boolean_from_the_extra_config_or_the_environment():
    assert settings.parse({"url": "http://a", "strict": True}, {})["strict"] is True
    assert settings.parse({"url": "http://a"}, {"ZTSERVE_STRICT": "1"})["strict"] is True
    assert settings.parse({"url": "http://a"}, {"ZTSERVE_STRICT": "false"})["strict"] is False
    assert settings.parse({"url": "http://a", "strict": False}, {"ZTSERVE_STRICT": "yes"})["strict"] is False


def test_hub_repository_ids_name_their_ztserve_models():
    assert settings.repo_to_model_ids("org/llama") == ["org/llama"]
    assert settings.repo_to_model_ids("org/team__llama") == ["org/team/llama"]
    assert settings.repo_to_model_ids("llama") == ["llama"]
    # A model at the top of a source is in the server's namespace, unless a model has that id.
    assert settings.repo_to_model_ids("local/llama") == ["local/llama", "llama"]
    assert settings.repo_to_model_ids("top/llama", "top") == ["top/llama", "llama"]
    assert settings.parse({"url": "http://a"}, {})["hub_namespace"] == "local"
    assert settings.parse({"url": "http://a"}, {"ZTSERVE_HUB_NAMESPACE": "top"})["hub_namespace"] == "top"
