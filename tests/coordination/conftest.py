"""The coordination tests' real etcd (`tests.etcd`)."""

from tests.etcd import etcd

__all__ = ["etcd"]
