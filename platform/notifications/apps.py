from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "notifications"
    verbose_name = "Notifications"

    def ready(self) -> None:
        from jobs.signals import job_notable
        from notifications.services import on_job_notable

        job_notable.connect(on_job_notable, dispatch_uid="notifications.on_job_notable")
