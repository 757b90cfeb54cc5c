"""Local development and `make run`: embedded PostgreSQL and broker unless the environment says otherwise."""

from config.settings.base import *
from config.settings.env import env_bool

DEBUG = env_bool("DJANGO_DEBUG", True)
