"""Load (or refresh) the demo fleet: ``python manage.py load_demo_fleet [--nodes N]``.

Idempotent: clusters are created once, their inventory is pushed through the same service the agents
use (an unchanged push changes nothing), and the standard DeviceClasses are created or brought back to
their shipped definition. Cluster tokens are not printed; use ``create_token --cluster NAME`` for one.
"""
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from inventory import demo
from inventory.models import Cluster, DeviceClass
from inventory.services import clusters as cluster_services
from inventory.services import fleet, sync


class Command(BaseCommand):
    help = "Load the demo fleet (realistic NVIDIA/AMD/Intel slices) scaled to N nodes over several clusters."

    def add_arguments(self, parser):
        parser.add_argument("--nodes", type=int, default=settings.DEMO_FLEET_NODES,
                            help=f"nodes in total (default DEMO_FLEET_NODES={settings.DEMO_FLEET_NODES})")

    def handle(self, *args, nodes, **opts):
        if nodes < 1:
            raise CommandError("--nodes must be at least 1")
        started = time.monotonic()
        for obj in demo.standard_device_classes():
            name = obj["metadata"]["name"]
            current = DeviceClass.objects.filter(cluster=None, name=name).first()
            if current is None or current.object != obj:
                fleet.replace_fleet_object(DeviceClass, name, obj, None)
        total_devices = 0
        for plan in demo.generate_fleet(nodes):
            with transaction.atomic():
                cluster = Cluster.objects.filter(name=plan.name).first()
                if cluster is None:
                    cluster, _ = cluster_services.create_cluster(name=plan.name, labels=plan.labels, with_token=False)
                elif cluster.labels != plan.labels:
                    cluster_services.update_cluster(cluster, labels=plan.labels)
            result = sync.push_inventory(plan.name, plan.body)
            total_devices += result["devices"]
            self.stdout.write(f"  {plan.name}: {len(plan.body['nodes'])} nodes, {result['devices']} devices, "
                              f"pools {result['pools']}" + ("" if result["changed"] else " (unchanged)"))
        self.stdout.write(self.style.SUCCESS(
            f"Demo fleet: {nodes} nodes, {total_devices} devices, {len(demo.standard_device_classes())} "
            f"DeviceClasses in {time.monotonic() - started:.1f}s"))
