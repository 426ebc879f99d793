from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self) -> None:
        from accounts.signals import plan_changed
        from jobs.signals import job_ended
        from jobs.tasks import on_job_ended, on_plan_changed

        plan_changed.connect(on_plan_changed, dispatch_uid="jobs.on_plan_changed")
        job_ended.connect(on_job_ended, dispatch_uid="jobs.on_job_ended")
