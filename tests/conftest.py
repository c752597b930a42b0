from redis_fixtures import *  # noqa: F403
